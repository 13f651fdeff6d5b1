"""A run interrupted, checkpointed and resumed equals the uninterrupted run with the same seeds
(noise_seed given); a secret-randomness run resumes with fresh secret draws; a checkpoint that was
corrupted, edited or saved by another run is refused with one line, and with a key any edit is."""

import copy
import datetime
import hashlib
import io
import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

from dpnoise.accounting import UnsoundAccountantWarning, get_accountant, noise_keywords
from dpnoise.errors import DpnoiseError
from dpnoise.training import (
    CheckpointMismatchError,
    endless_batches,
    load_checkpoint,
    make_private,
    save_checkpoint,
    train_steps,
)
from dpnoise.training.checkpoint import (
    CHECKPOINT_FORMAT,
    KEY_FILE_VARIABLE,
    KEY_VARIABLE,
    checkpoint_key,
    read_checkpoint,
    write_checkpoint_state,
)
from dpnoise.training.errors import CheckpointError, CheckpointKeyError, UnkeyedCheckpointWarning
from dpnoise.training.randomness import ReproducibleNoiseWarning

from training_helpers import digits_loader, mlp

TOTAL_STEPS, INTERRUPT_AT = 10, 4

# Most tests write unkeyed checkpoints on purpose; the warning itself is tested below.
pytestmark = pytest.mark.filterwarnings("ignore::dpnoise.training.errors.UnkeyedCheckpointWarning")


KEY = "k" * 32


def build(dataset, mechanism, seed, noise, model_seed=None, noise_seed="seed", **options):
    """A private run; its noise and sampling are seeded by ``seed`` too unless ``noise_seed`` is None (secret)."""
    model = mlp(hidden=16, seed=seed if model_seed is None else model_seed)  # the seed sets the initial weights
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibleNoiseWarning)
        return make_private(model, optimizer, digits_loader(dataset, 64), mechanism=mechanism,
                            **noise_keywords(mechanism, noise), max_grad_norm=1.0, delta=1e-5, seed=seed,
                            noise_seed=seed if noise_seed == "seed" else noise_seed, **options)


def run(module, optimizer, loader, steps):
    engine = optimizer.privacy_engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        train_steps(module, optimizer, endless_batches(loader), engine, steps)
        return engine.epsilon_by_accountant()


@pytest.mark.parametrize("mechanism,noise", [("lap2", 1.0), ("dirichlet", 0.2)])
def test_resume_equals_uninterrupted(digits_train, tmp_path, mechanism, noise):
    module, optimizer, loader = build(digits_train, mechanism, seed=7, noise=noise)
    torch.manual_seed(123)
    uninterrupted_epsilon = run(module, optimizer, loader, TOTAL_STEPS)
    uninterrupted = [p.detach().clone() for p in module.parameters()]

    module, optimizer, loader = build(digits_train, mechanism, seed=7, noise=noise)
    torch.manual_seed(123)
    run(module, optimizer, loader, INTERRUPT_AT)
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine, extra={"epoch": 0})
    del module, optimizer, loader

    # fresh objects, other initial weights: everything comes from the checkpoint
    module, optimizer, loader = build(digits_train, mechanism, seed=7, noise=noise, model_seed=99)
    restored = load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    assert restored == {"epoch": 0, "steps": INTERRUPT_AT}
    resumed_epsilon = run(module, optimizer, loader, TOTAL_STEPS - INTERRUPT_AT)

    engine = optimizer.privacy_engine
    assert engine.steps == TOTAL_STEPS
    assert all(acc.steps == TOTAL_STEPS for acc in engine.accountants.values())
    assert resumed_epsilon == uninterrupted_epsilon
    for resumed, expected in zip(module.parameters(), uninterrupted):
        torch.testing.assert_close(resumed, expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------- refused resumes
BUDGET = 5.0  # target epsilon of the checkpointed run (lap2, noise 1.0): a budget of more than 4 steps


@pytest.fixture(scope="module")
def saved(digits_train, tmp_path_factory):
    """A lap2 run (accountants lap2 and lap2-paper, seed 7) checkpointed after INTERRUPT_AT steps."""
    module, optimizer, loader = build(digits_train, "lap2", seed=7, noise=1.0, target_epsilon=BUDGET)
    run(module, optimizer, loader, INTERRUPT_AT)
    path = tmp_path_factory.mktemp("saved") / "run.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    return path


def fresh_engine(dataset, seed=7, noise=1.0):
    """A fresh run of the checkpointed setup: (module, optimizer, engine)."""
    module, optimizer, _ = build(dataset, "lap2", seed=seed, noise=noise, target_epsilon=BUDGET)
    return module, optimizer, optimizer.privacy_engine


def resume(dataset, path, seed=7, noise=1.0):
    """Load ``path`` into a fresh run of the checkpointed setup; returns its engine."""
    module, optimizer, engine = fresh_engine(dataset, seed, noise)
    load_checkpoint(path, module=module, optimizer=optimizer, engine=engine)
    return engine


def accountant_names(dataset):
    """(primary accountant, all recorded accountants) of the checkpointed setup."""
    setup = fresh_engine(dataset)[2].setup
    return setup.accountant, tuple(setup.accountants)


def tampered(saved, tmp_path, edit, key=None):
    """A copy of ``saved`` whose state ``edit`` changed, with a recomputed hash (a deliberate edit)."""
    state = read_checkpoint(saved, key=key)
    edit(state)
    path = tmp_path / "tampered.ckpt"
    write_checkpoint_state(path, state)
    return path


def refused(dataset, path, message, error=CheckpointMismatchError, **options):
    with pytest.raises(error, match=re.escape(message)) as caught:
        resume(dataset, path, **options)
    assert isinstance(caught.value, DpnoiseError) and isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_untampered_checkpoint_resumes(digits_train, saved):
    engine = resume(digits_train, saved)
    assert engine.steps == INTERRUPT_AT
    assert all(acc.steps == INTERRUPT_AT for acc in engine.accountants.values())


def test_ledger_count_edited_is_refused(digits_train, saved, tmp_path):
    primary, _ = accountant_names(digits_train)

    def edit(state):
        state["engine"]["accountants"][primary]["history"][0]["count"] = 1  # a smaller epsilon
    refused(digits_train, tampered(saved, tmp_path, edit),
            f"checkpoint is inconsistent in accountant '{primary}': its ledger records 1 steps, but the step counter says 4")


def test_ledgers_emptied_are_refused(digits_train, saved, tmp_path):
    def edit(state):
        for acc_state in state["engine"]["accountants"].values():
            acc_state["history"] = []
    refused(digits_train, tampered(saved, tmp_path, edit),
            f"checkpoint is inconsistent in accountant '{accountant_names(digits_train)[0]}': its ledger records 0 steps, "
            "but the step counter says 4")


def test_ledger_of_other_noise_is_refused(digits_train, saved, tmp_path):
    primary, _ = accountant_names(digits_train)

    def edit(state):  # same count, but the steps recorded with three times the noise
        state["engine"]["accountants"][primary]["history"][0]["event"]["event"]["noise_multiplier"] *= 3
    refused(digits_train, tampered(saved, tmp_path, edit),
            f"checkpoint is inconsistent in accountant '{primary}': its ledger is not 4 steps of this run's privacy setup")


def test_an_earlier_ledger_entry_of_other_noise_is_refused(digits_train, saved, tmp_path):
    """The ledger checked entry by entry, not only its latest: the first 2 of 4 steps relabelled with other noise."""
    primary, _ = accountant_names(digits_train)

    def edit(state):
        (entry,) = state["engine"]["accountants"][primary]["history"]
        relabelled = copy.deepcopy(entry)
        relabelled["event"]["event"]["noise_multiplier"] *= 2
        relabelled["count"] = entry["count"] = 2
        state["engine"]["accountants"][primary]["history"] = [relabelled, entry]
    refused(digits_train, tampered(saved, tmp_path, edit),
            f"checkpoint is inconsistent in accountant '{primary}': its ledger is not 4 steps of this run's privacy setup")


def test_accountants_emptied_or_removed_are_refused(digits_train, saved, tmp_path):
    _, names = accountant_names(digits_train)
    assert len(names) > 1

    def empty(state):
        state["engine"]["accountants"] = {}
    refused(digits_train, tampered(saved, tmp_path, empty),
            f"checkpoint differs from this run in accountants: none (checkpoint) vs {', '.join(names)} (this run)")

    def remove(state):
        del state["engine"]["accountants"][names[-1]]
    refused(digits_train, tampered(saved, tmp_path, remove),
            f"checkpoint differs from this run in accountants: {', '.join(names[:-1])} (checkpoint) vs "
            f"{', '.join(names)} (this run)")


@pytest.mark.parametrize("steps", [0, INTERRUPT_AT + 1])
def test_step_counter_changed_is_refused(digits_train, saved, tmp_path, steps):
    def edit(state):
        state["engine"]["steps"] = steps
    refused(digits_train, tampered(saved, tmp_path, edit),
            f"checkpoint is inconsistent in accountant '{accountant_names(digits_train)[0]}': its ledger records 4 steps, "
            f"but the step counter says {steps}")


def test_step_counter_outside_the_budget_is_refused(digits_train, saved, tmp_path):
    engine = fresh_engine(digits_train)[2]
    max_steps, step_event = engine.max_steps, engine.step_event
    assert max_steps > INTERRUPT_AT

    def past_budget(state):  # counter and ledgers agree, but on more steps than the budget allows
        engine_state = state["engine"]
        engine_state["steps"] = max_steps + 1
        for name in engine_state["accountants"]:
            engine_state["accountants"][name] = get_accountant(name).compose(step_event, max_steps + 1).state_dict()
    refused(digits_train, tampered(saved, tmp_path, past_budget),
            f"checkpoint is inconsistent in steps: {max_steps + 1} steps taken, but the budget epsilon={BUDGET} "
            f"(delta=1e-05) allows at most {max_steps}")

    def negative(state):
        state["engine"]["steps"] = -1
    refused(digits_train, tampered(saved, tmp_path, negative),
            "checkpoint is inconsistent in steps: -1 is not a step count (an integer >= 0)")

    def exhausted_early(state):
        state["engine"]["budget_exhausted"] = True
    refused(digits_train, tampered(saved, tmp_path, exhausted_early),
            f"checkpoint is inconsistent in budget_exhausted: set after 4 steps with a budget of {max_steps} steps")


def test_other_noise_is_refused(digits_train, saved, tmp_path):
    message = refused(digits_train, saved, "checkpoint differs from this run in noise: 1.0 (checkpoint) vs 2.0 (this run)",
                      noise=2.0)
    assert "PrivacySetup" not in message

    def edit(state):  # the setup edited in the file: refused the same way
        state["engine"]["setup"]["noise"] = 0.8
    refused(digits_train, tampered(saved, tmp_path, edit),
            "checkpoint differs from this run in noise: 0.8 (checkpoint) vs 1.0 (this run)")


def test_other_seed_is_refused(digits_train, saved):
    refused(digits_train, saved, "checkpoint differs from this run in seed: 7 (checkpoint) vs 8 (this run)", seed=8)


def test_refused_resume_changes_nothing(digits_train, saved):
    module, optimizer, engine = fresh_engine(digits_train, seed=8)
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(CheckpointMismatchError, match="seed"):
        load_checkpoint(saved, module=module, optimizer=optimizer, engine=engine)
    assert engine.steps == 0 and all(acc.steps == 0 for acc in engine.accountants.values())
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before))


def test_corrupted_bytes_are_refused(digits_train, saved, tmp_path):
    raw = bytearray(saved.read_bytes())
    payload = torch.load(saved, weights_only=True)["payload"].numpy().tobytes()
    start = bytes(raw).find(payload)
    assert start > 0
    raw[start + len(payload) // 2] ^= 0x01  # one bit of the serialised state
    path = tmp_path / "corrupted.ckpt"
    path.write_bytes(bytes(raw))
    refused(digits_train, path, f"{path}: checkpoint content does not match its SHA-256 hash", error=CheckpointError)


@pytest.mark.parametrize("content,problem", [
    (None, "cannot read checkpoint: no such file"),
    (b"", "not a dpnoise checkpoint: the file is empty"),
    (b"step 4, epsilon 0.7\n", "not a dpnoise checkpoint: not a torch archive"),
    ("half", "truncated or corrupted checkpoint"),
])
def test_unreadable_files_are_refused(digits_train, saved, tmp_path, content, problem):
    path = tmp_path / "bad.ckpt"
    if content == "half":
        content = saved.read_bytes()[: saved.stat().st_size // 2]
    if content is not None:
        path.write_bytes(content)
    refused(digits_train, path, f"{path}: {problem}", error=CheckpointError)


def test_other_formats_are_refused(digits_train, saved, tmp_path):
    old = tmp_path / "format1.ckpt"  # what format 1 wrote: the state itself, numpy RNG included
    torch.save({"format": 1, "numpy_rng": np.random.get_state()}, old)
    refused(digits_train, old, f"{old}: not a dpnoise checkpoint of format {CHECKPOINT_FORMAT}: it holds pickled "
                                "objects, as checkpoints of format 1", error=CheckpointError)
    for other in (CHECKPOINT_FORMAT - 1, CHECKPOINT_FORMAT + 1):  # format 2 unpickled any object; a newer one
        path = tmp_path / f"format{other}.ckpt"
        torch.save({"format": other}, path)
        refused(digits_train, path, f"{path}: checkpoint format {other} is not supported", error=CheckpointError)


# ----------------------------------------------------------------------------- private randomness
def test_secret_randomness_differs_between_runs_and_resumes_fresh(digits_train, tmp_path):
    """Without noise_seed two runs of the same seed draw other noise and batches; the checkpoint holds no
    generator state, and the resumed run continues with fresh secret draws."""
    finals = []
    for _ in range(2):
        module, optimizer, loader = build(digits_train, "gaussian", seed=7, noise=1.0, noise_seed=None)
        assert optimizer.privacy_engine.private_randomness == "secret"
        run(module, optimizer, loader, 3)
        finals.append([p.detach().clone() for p in module.parameters()])
    assert not all(torch.equal(a, b) for a, b in zip(*finals))
    path = tmp_path / "secret.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    state = read_checkpoint(path)
    assert state["engine"]["private_randomness"] == "secret"
    assert state["engine"]["generators"]["ranks"] == [{}]
    module, optimizer, loader = build(digits_train, "gaussian", seed=7, noise=1.0, noise_seed=None)
    load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    run(module, optimizer, loader, 2)
    assert optimizer.privacy_engine.steps == 5


def test_explicit_noise_seed_warns():
    with pytest.warns(ReproducibleNoiseWarning, match="anyone who knows this seed"):
        from dpnoise.training import PrivacyEngine

        PrivacyEngine(seed=1, noise_seed=2)


def test_replaced_generator_state_is_refused(digits_train, saved, tmp_path):
    def fresh_state(state):  # a fresh seed-0 generator in place of the run's noise generator
        state["engine"]["generators"]["ranks"][0]["noise"] = torch.Generator().manual_seed(0).get_state()
    refused(digits_train, tampered(saved, tmp_path, fresh_state),
            "checkpoint differs from this run in noise_seed, or its rank 0 noise generator was replaced or edited: "
            "its state does not carry this run's noise-seed tag")


def test_another_noise_seed_is_named(digits_train, saved):
    module, optimizer, _ = build(digits_train, "lap2", seed=7, noise=1.0, target_epsilon=BUDGET, noise_seed=8)
    with pytest.raises(CheckpointMismatchError, match=r"^checkpoint differs from this run in noise_seed.*resume with "
                                                      r"the noise_seed it was written with"):
        load_checkpoint(saved, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)


def test_private_randomness_must_match(digits_train, saved):
    module, optimizer, _ = build(digits_train, "lap2", seed=7, noise=1.0, target_epsilon=BUDGET, noise_seed=None)
    with pytest.raises(CheckpointMismatchError, match=re.escape("private randomness: noise_seed (checkpoint) vs secret (this run)")):
        load_checkpoint(saved, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)


# ----------------------------------------------------------------------------- keyed checkpoints
@pytest.fixture(scope="module")
def keyed(digits_train, tmp_path_factory):
    module, optimizer, loader = build(digits_train, "lap2", seed=7, noise=1.0, target_epsilon=BUDGET)
    run(module, optimizer, loader, INTERRUPT_AT)
    path = tmp_path_factory.mktemp("keyed") / "run.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine, key=KEY)
    return path


def resume_keyed(dataset, path, key):
    module, optimizer, engine = fresh_engine(dataset)
    load_checkpoint(path, module=module, optimizer=optimizer, engine=engine, key=key)
    return engine


def test_keyed_checkpoint_resumes_with_its_key(digits_train, keyed, monkeypatch):
    assert resume_keyed(digits_train, keyed, KEY).steps == INTERRUPT_AT
    monkeypatch.setenv(KEY_VARIABLE, KEY)  # the same key from the environment
    assert resume_keyed(digits_train, keyed, None).steps == INTERRUPT_AT


def test_consistent_edit_of_a_keyed_checkpoint_is_refused(digits_train, keyed, tmp_path):
    """Step counter and ledgers edited together and the hash recomputed (what passes without a key)."""
    engine = fresh_engine(digits_train)[2]
    step_event = engine.step_event

    def fewer_steps(state):
        state["engine"]["steps"] = 1
        for name in state["engine"]["accountants"]:
            state["engine"]["accountants"][name] = get_accountant(name).compose(step_event, 1).state_dict()
    path = tampered(keyed, tmp_path, fewer_steps, key=KEY)
    assert resume(digits_train, path).steps == 1  # without a key the consistent edit is not detected
    with pytest.raises(CheckpointError, match="carries no HMAC"):
        resume_keyed(digits_train, path, KEY)
    state = read_checkpoint(keyed, key=KEY)
    fewer_steps(state)
    write_checkpoint_state(path, state, key="x" * 32)  # re-signed with another key
    with pytest.raises(CheckpointError, match="does not match its HMAC"):
        resume_keyed(digits_train, path, KEY)


def test_keys_must_match_the_checkpoint(digits_train, keyed, saved):
    with pytest.raises(CheckpointError, match="the checkpoint is keyed: give its key"):
        resume_keyed(digits_train, keyed, None)
    with pytest.raises(CheckpointError, match="carries no HMAC"):
        resume_keyed(digits_train, saved, KEY)


def test_short_or_unreadable_keys_are_refused(tmp_path, monkeypatch):
    with pytest.raises(CheckpointKeyError, match="is 5 bytes; at least 32"):
        checkpoint_key("short")
    monkeypatch.setenv(KEY_FILE_VARIABLE, str(tmp_path / "missing.key"))
    with pytest.raises(CheckpointKeyError, match="cannot read"):
        checkpoint_key()
    (tmp_path / "good.key").write_bytes(b"\x01" * 40)
    monkeypatch.setenv(KEY_FILE_VARIABLE, str(tmp_path / "good.key"))
    assert checkpoint_key() == b"\x01" * 40


@pytest.mark.parametrize("setting, message", [
    ({KEY_VARIABLE: ""}, r"\$DPNOISE_CHECKPOINT_KEY is set but empty"),
    ({KEY_FILE_VARIABLE: ""}, r"\$DPNOISE_CHECKPOINT_KEY_FILE is set but empty"),
    ({KEY_VARIABLE: "k" * 40, KEY_FILE_VARIABLE: "key.txt"}, "both .* are set; set one"),
])
def test_key_settings_fail_closed(setting, message, monkeypatch):
    # An empty value (a failed $(cat key)) must not mean "no key": the run would write unkeyed checkpoints.
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CheckpointKeyError, match=message):
        checkpoint_key()


@pytest.mark.parametrize("setting", [{KEY_VARIABLE: ""}, {KEY_VARIABLE: "k" * 10}, {KEY_FILE_VARIABLE: "/no/such.key"}])
def test_a_bad_key_setting_stops_dpnoise_train_before_any_work_even_without_out(setting, monkeypatch, capsys):
    from dpnoise.cli.main import main

    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "--dataset", "digits", "--limit", "128", "--mechanism", "lap2", "--noise", "1",
                 "--delta", "1e-5", "--epochs", "0.1", "--batch-size", "32", "--no-progress"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "checkpoint key" in error[0]


# ----------------------------------------------------------------------------- loading runs no code
def test_a_payload_that_runs_code_when_unpickled_is_refused_unrun(digits_train, saved, tmp_path):
    """A hand-made envelope whose (correctly hashed) payload calls os.system when unpickled."""
    marker = tmp_path / "ran"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    state = read_checkpoint(saved)
    state["extra"] = {"note": RunsCode()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    path = tmp_path / "runs-code.ckpt"
    torch.save({"format": CHECKPOINT_FORMAT, "sha256": hashlib.sha256(payload).hexdigest(),
                "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8)}, path)
    refused(digits_train, path, f"{path}: the checkpoint holds objects other than tensors and plain data, which could "
                                "run code when loaded; refused without loading them (it would call posix.system)",
            error=CheckpointError)
    assert not marker.exists()


@pytest.mark.parametrize("value, kind", [(datetime.date(2020, 1, 1), "datetime.date"),
                                         (np.float64(0.5), "numpy.float64")])
def test_objects_other_than_tensors_and_plain_data_are_not_written(digits_train, tmp_path, value, kind):
    module, optimizer, _ = build(digits_train, "lap2", seed=7, noise=1.0)
    path = tmp_path / "run.ckpt"
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint state['extra']['note'] is a {kind}: a checkpoint "
                                                        "holds tensors and plain data only")):
        save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine,
                        extra={"note": value})
    assert not path.exists()


def test_the_privacy_state_is_plain_data(saved):
    """Everything but the generators' byte tensors is JSON as it stands (json.dumps raises for any other object)."""
    engine_state = read_checkpoint(saved)["engine"]
    generators = engine_state.pop("generators")
    json.dumps(engine_state)
    assert {type(value) for rank in generators["ranks"] for value in rank.values()} == {torch.Tensor, str}


# ----------------------------------------------------------------------------- the run record
def keyword(key):
    return {} if key is None else {"key": key}


def run_with_checkpoints(dataset, folder, key=None, stops=(2, 4)):
    """A lap2 run of the checkpointed setup, saved into ``folder`` as ``step<k>.ckpt`` at each of ``stops``;
    returns the paths and the epsilon after the last stop."""
    module, optimizer, loader = build(dataset, "lap2", seed=7, noise=1.0, target_epsilon=BUDGET)
    folder.mkdir(parents=True, exist_ok=True)
    paths, done = [], 0
    for stop in stops:
        epsilon = run(module, optimizer, loader, stop - done)
        done = stop
        paths.append(folder / f"step{stop}.ckpt")
        save_checkpoint(paths[-1], module=module, optimizer=optimizer, engine=optimizer.privacy_engine, **keyword(key))
    return paths, epsilon


def resume_with(dataset, path, key=None, **options):
    module, optimizer, engine = fresh_engine(dataset)
    load_checkpoint(path, module=module, optimizer=optimizer, engine=engine, **keyword(key), **options)
    return engine


@pytest.mark.parametrize("key", [KEY, None])
def test_an_older_checkpoint_is_refused_unless_accepted_with_every_step_counted(digits_train, tmp_path, key):
    (older, latest), epsilon = run_with_checkpoints(digits_train, tmp_path, key)
    message = (f"{older} is older than its run's latest checkpoint: it holds 2 steps, the run took 4 (run-record.json); "
               "resuming it would forget 2 steps")
    with pytest.raises(CheckpointMismatchError, match=re.escape(message)):
        resume_with(digits_train, older, key)
    shutil.copy(older, latest)  # the older genuine checkpoint put back in place of the latest
    with pytest.raises(CheckpointMismatchError, match="it holds 2 steps, the run took 4"):
        resume_with(digits_train, latest, key)

    engine = resume_with(digits_train, older, key, resume_older=True)
    assert engine.steps == 4 and all(acc.steps == 4 for acc in engine.accountants.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        assert engine.epsilon_by_accountant() == epsilon


def test_an_older_checkpoint_is_refused_against_the_output_folders_record(digits_train, tmp_path):
    """A copy of the step-2 checkpoint taken elsewhere, resumed into the run's folder after the run reached step 4."""
    (older, _), _ = run_with_checkpoints(digits_train, tmp_path / "run")
    copy = tmp_path / "copy" / older.name
    copy.parent.mkdir()
    shutil.copy(older, copy)
    assert resume_with(digits_train, copy).steps == 2  # unkeyed, and no record next to it: nothing to compare with
    with pytest.raises(CheckpointMismatchError, match=re.escape(f"{copy} is older than its run's latest checkpoint: "
                                                                "it holds 2 steps, the run took 4")):
        resume_with(digits_train, copy, output_folder=tmp_path / "run")


def test_a_consistent_edit_to_fewer_steps_is_refused_by_the_run_record(digits_train, tmp_path):
    """Without a key: step counter and every ledger edited to fewer steps, hash recomputed, record left alone."""
    (_, latest), _ = run_with_checkpoints(digits_train, tmp_path)
    step_event = fresh_engine(digits_train)[2].step_event

    def fewer_steps(state):
        state["engine"]["steps"] = 3
        for name in state["engine"]["accountants"]:
            state["engine"]["accountants"][name] = get_accountant(name).compose(step_event, 3).state_dict()
    state = read_checkpoint(latest)
    fewer_steps(state)
    write_checkpoint_state(latest, state)
    with pytest.raises(CheckpointMismatchError, match="it holds 3 steps, the run took 4"):
        resume_with(digits_train, latest)
    # What an unkeyed checkpoint cannot protect: the record edited consistently too
    record_path = tmp_path / "run-record.json"
    record = json.loads(record_path.read_text())
    (entry,) = record["runs"].values()
    entry["steps"] = 3
    record_path.write_text(json.dumps(record))
    assert resume_with(digits_train, latest).steps == 3


def test_a_relabelled_setup_and_ledger_is_refused(digits_train, tmp_path):
    """Noise 1 -> 2 in the setup and in every ledger, resumed with noise 2: the record says the steps used noise 1."""
    (_, latest), _ = run_with_checkpoints(digits_train, tmp_path)
    relabelled = fresh_engine(digits_train, noise=2.0)[2]
    state = read_checkpoint(latest)
    state["engine"]["setup"]["noise"] = 2.0
    for name in state["engine"]["accountants"]:
        state["engine"]["accountants"][name] = get_accountant(name).compose(relabelled.step_event, 4).state_dict()
    write_checkpoint_state(latest, state)
    refused(digits_train, latest, f"{tmp_path / 'run-record.json'} records that run {state['engine']['run_id']} took "
                                  "its steps with noise 1.0; this run has 2.0", noise=2.0)


def test_a_keyed_checkpoint_needs_its_authentic_run_record(digits_train, tmp_path):
    (_, latest), _ = run_with_checkpoints(digits_train, tmp_path / "run", KEY)
    alone = tmp_path / "alone" / latest.name
    alone.parent.mkdir()
    shutil.copy(latest, alone)
    with pytest.raises(CheckpointError, match=re.escape(f"holds none of run {read_checkpoint(latest, key=KEY)['engine']['run_id']}")):
        resume_with(digits_train, alone, KEY)

    record_path = tmp_path / "run" / "run-record.json"
    record = json.loads(record_path.read_text())
    (entry,) = record["runs"].values()
    entry["steps"] = 1  # lowered, so that an older checkpoint would pass
    record_path.write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="is not authentic under this checkpoint key"):
        resume_with(digits_train, latest, KEY)


def test_unkeyed_checkpoints_warn_once_per_run_and_keyed_ones_never(digits_train, tmp_path):
    for key, expected in ((None, 1), (KEY, 0)):
        folder = tmp_path / ("keyed" if key else "unkeyed")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_with_checkpoints(digits_train, folder, key)
        unkeyed = [str(w.message) for w in caught if issubclass(w.category, UnkeyedCheckpointWarning)]
        assert len(unkeyed) == expected
        assert all("can change the step counter, the ledgers and the setup" in message for message in unkeyed)
