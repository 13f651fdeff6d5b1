"""A run interrupted, checkpointed and resumed equals the uninterrupted run with the same seed;
a checkpoint that was corrupted, edited or saved by another run is refused with one line."""

import re
import warnings

import numpy as np
import pytest
import torch

from dpnoise.accounting import ACCOUNTANTS, UnsoundAccountantWarning, get_accountant, noise_keywords
from dpnoise.errors import DpnoiseError
from dpnoise.training import (
    CheckpointMismatchError,
    endless_batches,
    load_checkpoint,
    make_private,
    save_checkpoint,
    train_steps,
)
from dpnoise.training.checkpoint import CHECKPOINT_FORMAT, read_checkpoint, write_checkpoint_state
from dpnoise.training.engine import _same_state
from dpnoise.training.errors import CheckpointError

from training_helpers import digits_loader, mlp

TOTAL_STEPS, INTERRUPT_AT = 10, 4


def build(dataset, mechanism, seed, noise, model_seed=None, **options):
    model = mlp(hidden=16, seed=seed if model_seed is None else model_seed)  # the seed sets the initial weights
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return make_private(model, optimizer, digits_loader(dataset, 64), mechanism=mechanism, **noise_keywords(mechanism, noise),
                        max_grad_norm=1.0, delta=1e-5, seed=seed, **options)


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


def tampered(saved, tmp_path, edit):
    """A copy of ``saved`` whose state ``edit`` changed, with a recomputed hash (a deliberate edit)."""
    state = read_checkpoint(saved)
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
    max_steps, arguments = engine.max_steps, engine.accounting_step_arguments()
    assert max_steps > INTERRUPT_AT

    def past_budget(state):  # counter and ledgers agree, but on more steps than the budget allows
        engine_state = state["engine"]
        engine_state["steps"] = max_steps + 1
        for name in engine_state["accountants"]:
            engine_state["accountants"][name] = get_accountant(name).step(**arguments, steps=max_steps + 1).state_dict()
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
    newer = tmp_path / "format3.ckpt"
    torch.save({"format": 3}, newer)
    refused(digits_train, newer, f"{newer}: checkpoint format 3 is not supported", error=CheckpointError)


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_single_steps_equal_one_multi_step(name):
    """The ledger check's assumption, for every registered accountant: k steps one by one leave
    the same state as ``step(steps=k)``."""
    mechanism = ACCOUNTANTS[name].mechanism
    arguments = dict(sample_rate=0.05, clip=1.0, params=100, alpha=1.0 if mechanism == "dirichlet" else None,
                     **noise_keywords(mechanism, 1.0))
    one_by_one, at_once = get_accountant(name), get_accountant(name)
    for _ in range(3):
        one_by_one.step(**arguments)
    at_once.step(**arguments, steps=3)
    assert _same_state(one_by_one.state_dict(), at_once.state_dict())
