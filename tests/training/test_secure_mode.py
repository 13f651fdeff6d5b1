"""Secure mode (``make_private(secure_mode=True)``, ``--secure-mode``): the released gradients are
multiples of the plan's grid and no float sampler draws; the Gaussian's reported epsilons and budget
carry the discrete Gaussian's correction; refusals before any step; checkpoints bind the mode."""

import dataclasses
import json
import re
import warnings
from functools import partial

import pytest
import torch

from dpnoise.accounting import UnsoundAccountantWarning, epsilon_of_events, noise_keywords
from dpnoise.accounting.events import DiscreteGaussianStepEvent
from dpnoise.accounting.secure_noise import discrete_gaussian_epsilon
from dpnoise.cli.main import main
from dpnoise.training import (
    CheckpointMismatchError,
    InvalidConfigError,
    endless_batches,
    load_checkpoint,
    make_private,
    save_checkpoint,
    train_steps,
)
from dpnoise.training.checkpoint import read_checkpoint
from dpnoise.training.config import TrainingConfig, check_config
from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.randomness import ReproducibleNoiseWarning

from training_helpers import digits_loader, mlp

NOISE = {"gaussian": 1.0, "lap2": 1.0, "laplace-l1": 5.0}


def build(dataset, mechanism="gaussian", secure_mode=True, model=None, **options):
    model = mlp(hidden=16) if model is None else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    options = {"max_grad_norm": 1.0, "seed": 7, **options}
    if mechanism in NOISE and "epochs" not in options:
        options = {**noise_keywords(mechanism, NOISE[mechanism]), **options}
    return make_private(model, optimizer, digits_loader(dataset, 64), mechanism=mechanism, delta=1e-5,
                        secure_mode=secure_mode, **options)


def released_gradients(optimizer) -> list[list[torch.Tensor]]:
    """Records every step's released sums (before the scaling and the parameter update)."""
    released, release = [], optimizer.noisy_sum.release

    def recording(params, gate) -> list[torch.Tensor]:
        sums = release(params, gate)
        released.append([value.detach().clone() for value in sums])
        return sums

    optimizer.noisy_sum.release = recording
    return released


@pytest.mark.parametrize("mechanism", sorted(NOISE))
def test_secure_mode_trains_with_releases_on_the_grid(digits_train, mechanism):
    module, optimizer, loader = build(digits_train, mechanism)
    engine = optimizer.privacy_engine
    released = released_gradients(optimizer)
    noise_state = engine.noise_generator.get_state()
    before = [p.detach().clone() for p in module.parameters()]
    train_steps(module, optimizer, endless_batches(loader), engine, 3)
    grid = engine.secure_plan.rounding.grid
    assert len(released) == 3 and engine.steps == 3
    for step in released:
        for grad in step:
            assert torch.equal(grad / grid, torch.round(grad / grid))  # integral multiples of the grid
    # noisy (not the rounded sum alone) and no draw from torch's noise generator
    assert any(not torch.equal(a, b) for a, b in zip(released[0], released[1]))
    assert torch.equal(engine.noise_generator.get_state(), noise_state)
    assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(module.parameters(), before))
    record = engine.secure_noise
    assert record["grid"] == grid and 1.0 < record["inflation"] <= 1.0 + 2.0 ** -10
    assert record["sampler"] == ("discrete gaussian" if mechanism == "gaussian" else "floored laplace")
    assert record["noise_in_use"] >= NOISE[mechanism] * record["inflation"] * (1 - 1e-12)


def continuous_epsilon(accountant, event, steps, delta):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return epsilon_of_events(accountant, event, steps=steps, delta=delta)


@pytest.mark.filterwarnings("ignore::dpnoise.accounting.UnsoundAccountantWarning")
def test_gaussian_epsilons_carry_the_correction_and_laplace_ones_do_not(digits_train):
    for mechanism in ("gaussian", "lap2"):
        module, optimizer, loader = build(digits_train, mechanism)
        engine = optimizer.privacy_engine
        train_steps(module, optimizer, endless_batches(loader), engine, 2)
        reported = engine.epsilon_by_accountant()
        # every accountant read directly reports the run's epsilon: the ledger carries the release
        assert reported == {name: acc.get_epsilon(1e-5) for name, acc in engine.accountants.items()}
        assert engine.get_epsilon() == reported[engine.setup.accountant]
        if mechanism == "gaussian":
            assert isinstance(engine.step_event, DiscreteGaussianStepEvent)
            # each accountant's continuous epsilon(delta e^-L) + 2 L (secure_noise.md §3.3), not compared with
            # the continuous one by size: here L ~ 1e-133, so delta e^-L is delta (1 - 2^-50), and two certified
            # PLD bounds that close in delta may differ either way by the round-off of their solve (~1e-12)
            coordinates = engine.secure_plan.rounding.coordinates
            continuous = {name: partial(continuous_epsilon, name, engine.step_event.event, engine.steps)
                          for name in engine.accountants}
            assert reported == {name: discrete_gaussian_epsilon(epsilon_at, 1e-5, engine.steps, coordinates)
                                for name, epsilon_at in continuous.items()}
            assert all(reported[name] != continuous[name](1e-5) for name in reported)
            assert engine.get_quick_epsilon() >= engine.get_epsilon()
        else:
            assert not isinstance(engine.step_event, DiscreteGaussianStepEvent)


def test_budget_and_calibration_meet_the_corrected_epsilon(digits_train):
    """A calibrated secure Gaussian run plans its steps within the corrected budget, and the budget
    stops at the last step whose corrected epsilon is within the target."""
    target = 1.0
    _, optimizer, _ = build(digits_train, target_epsilon=target, epochs=1, accountant="gaussian-rdp")
    engine = optimizer.privacy_engine
    assert engine.max_steps >= engine.planned_steps
    n = engine.secure_plan.rounding.coordinates

    def corrected(steps):
        epsilon = epsilon_of_events("gaussian-rdp", engine.step_event, steps=steps, delta=1e-5)
        assert epsilon == discrete_gaussian_epsilon(
            partial(continuous_epsilon, "gaussian-rdp", engine.step_event.event, steps), 1e-5, steps, n)
        return epsilon

    assert corrected(engine.max_steps) <= target < corrected(engine.max_steps + 1)


@pytest.mark.parametrize("options,message", [
    ({"mechanism": "dirichlet", "concentration": 0.2}, "secure_mode serves the gradient mechanisms"),
    ({"mechanism": "penultimate-gaussian", "noise_multiplier": 2.0}, "'penultimate-gaussian' is not covered"),
    ({"noise_seed": 3}, "cannot be combined with the engine's noise_seed"),
    ({"poisson_sampling": False}, "secure_mode needs poisson_sampling=True"),
    ({"secure_mode": "yes"}, "secure_mode must be True or False"),
    ({"model": mlp(hidden=16).half(), "max_grad_norm": 1e-3}, "which parameter '1.weight' (torch.float16"),
])
def test_unservable_setups_are_refused_before_any_step(digits_train, options, message):
    options = {"mechanism": "gaussian", "secure_mode": True, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibleNoiseWarning)
        with pytest.raises(InvalidTrainingOptionError, match=re.escape(message)):
            build(digits_train, **options)


def test_process_groups_are_refused(digits_train, monkeypatch):
    class TwoRanks:
        world_size, rank = 2, 0

    monkeypatch.setattr("dpnoise.training.validation.current_group", lambda device: TwoRanks())
    with pytest.raises(InvalidTrainingOptionError, match="secure_mode is not supported in a process group of 2 ranks"):
        build(digits_train)


def test_checkpoints_hold_no_generator_and_bind_the_mode(digits_train, tmp_path):
    module, optimizer, loader = build(digits_train, "lap2")
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 2)
    path = tmp_path / "secure.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    engine_state = read_checkpoint(path)["engine"]
    assert engine_state["setup"]["secure_mode"] is True and engine_state["generators"]["ranks"] == [{}]

    module, optimizer, loader = build(digits_train, "lap2")
    load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 1)
    assert optimizer.privacy_engine.steps == 3

    module, optimizer, _ = build(digits_train, "lap2", secure_mode=False)
    mismatch = "differs from this run in secure_mode: True (checkpoint) vs False (this run)"
    with pytest.raises(CheckpointMismatchError, match=re.escape(mismatch)):
        load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    module, optimizer, _ = build(digits_train, "lap2")
    with pytest.raises(CheckpointMismatchError, match="secure_mode: False"):
        load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)


def test_a_secure_gaussian_state_written_with_continuous_steps_resumes_as_discrete_steps(digits_train):
    """Engine states saved before secure steps were recorded as discrete-Gaussian events hold the continuous
    step in every ledger; they resume with the ledgers rewritten, and a ledger edited otherwise is still refused."""
    from dpnoise.accounting import accountant_holding

    module, optimizer, loader = build(digits_train, "gaussian")
    engine = optimizer.privacy_engine
    train_steps(module, optimizer, endless_batches(loader), engine, 2)
    state = engine.state_dict()
    old = {name: accountant_holding(name, ()).compose(engine.step_event.event, 2).state_dict()
           for name in engine.accountants}
    assert all(old[name] != state["accountants"][name] for name in old)
    _, resumed_optimizer, _ = build(digits_train, "gaussian")
    resumed = resumed_optimizer.privacy_engine
    resumed.load_state_dict({**state, "accountants": old})
    assert resumed.steps == 2 and resumed.epsilon_by_accountant() == engine.epsilon_by_accountant()
    assert all(acc.history == engine.accountants[name].history for name, acc in resumed.accountants.items())
    edited = {**old, "gaussian-rdp": accountant_holding("gaussian-rdp", ()).compose(engine.step_event.event, 1)
              .state_dict()}
    with pytest.raises(CheckpointMismatchError, match="gaussian-rdp"):
        build(digits_train, "gaussian")[1].privacy_engine.load_state_dict({**state, "accountants": edited})


# ----------------------------------------------------------------------------- configuration and command line
SECURE = {"data.name": "digits", "privacy.mechanism": "gaussian", "privacy.noise": 1.0, "privacy.delta": 1e-5,
          "privacy.epochs": 1, "schedule.batch_size": 64, "privacy.secure_mode": True}


@pytest.mark.parametrize("fields,message", [
    ({"privacy.mechanism": "dirichlet"},
     "privacy.secure_mode serves privacy.mechanism gaussian, lap2, laplace-l1, got 'dirichlet'"),
    ({"noise_seed": 1}, "it cannot be combined with noise_seed"),
    ({"data.feature_statistics_noise": 8.0}, "privacy.secure_mode does not cover data.feature_statistics_noise"),
    ({"privacy.secure_mode": 1}, "privacy.secure_mode must be True or False, got 1"),
])
def test_config_refusals_name_the_fields(fields, message):
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        TrainingConfig.from_fields({**SECURE, **fields})
    if "privacy.secure_mode" not in fields:  # a configuration built otherwise: check_config names them too
        config = TrainingConfig.from_fields({**SECURE, "privacy.secure_mode": False, **fields})
        privacy = dataclasses.replace(config.privacy, secure_mode=True)
        with pytest.raises(InvalidConfigError, match=re.escape(message)):
            check_config(dataclasses.replace(config, privacy=privacy))


def test_cli_secure_mode_reports_the_grid(capsys):
    common = ["train", "--dataset", "digits", "--model", "cnn", "--mechanism", "gaussian", "--noise", "1",
              "--delta", "1e-5", "--epochs", "1", "--max-steps", "2", "--batch-size", "64", "--threads", "1",
              "--no-progress", "--secure-mode"]
    assert main([*common, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["secure_mode"] is True and summary["steps"] == 2
    assert set(summary["secure_noise"]) >= {"grid", "inflated_clip", "inflation"}
    assert main(common) == 0
    assert "secure mode: discrete gaussian noise from os.urandom on the grid 2^-" in capsys.readouterr().out
    assert main([*common, "--noise-seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--secure-mode" in err[0] and "--noise-seed" in err[0]


def test_secure_mode_draws_the_poisson_batches_from_the_operating_system(digits_train):
    # Amplification by subsampling needs the batches as secret as the noise: none of them may come from the
    # Mersenne-Twister sampling generator (63 secret bits of seed, then deterministic).
    module, optimizer, loader = build(digits_train)
    state = optimizer.privacy_engine.sampling_generator.get_state()
    sizes = [len(targets) for _, (_, targets) in zip(range(20), loader)]
    assert torch.equal(optimizer.privacy_engine.sampling_generator.get_state(), state)
    assert 20 < sum(sizes) / len(sizes) < 110  # Poisson batches of about 64


def test_system_random_inclusions_have_the_sample_rate():
    from dpnoise.training.sampling import system_random_inclusions

    n, q = 400_000, 0.01
    included = system_random_inclusions(n, q)
    assert included.dtype == torch.bool and included.shape == (n,)
    assert abs(included.sum().item() - n * q) < 5 * (n * q * (1 - q)) ** 0.5
    assert not system_random_inclusions(1000, 0.0).any() and system_random_inclusions(1000, 1.0).all()
