"""Releases of the training data before training (``make_private(data_releases=...)``): composed into
every accountant, the calibration and the budget, recorded in checkpoints; refused where they do not apply.
And the same through ``dpnoise train --feature-statistics-noise``."""

import json
import math
import warnings

import pytest
import torch

from dpnoise.accounting import UnreachableTargetError, calibrate_noise, epsilon_after, epsilon_of_events, noise_keywords
from dpnoise.accounting.events import (ComposedEvent, DirichletEvent, GaussianEvent, PoissonSampledEvent,
                                      SelfComposedEvent)
from dpnoise.cli.main import main
from dpnoise.training import (CheckpointMismatchError, endless_batches, load_checkpoint, make_private, save_checkpoint,
                              train_steps)

from training_helpers import digits_loader, mlp

RELEASE = SelfComposedEvent(GaussianEvent(8.0), 4)


def build(dataset, mechanism="gaussian", releases=(RELEASE,), **options):
    model = mlp(hidden=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"delta": 1e-5, "max_grad_norm": 1.0, "seed": 0, **options}
    return make_private(model, optimizer, digits_loader(dataset, 64), mechanism=mechanism,
                        data_releases=releases, **options)


@pytest.mark.filterwarnings("ignore::dpnoise.accounting.UnsoundAccountantWarning")  # lap2-paper is recorded too
@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "laplace-l1"])
def test_every_accountant_holds_the_release_before_the_first_step(digits_train, mechanism):
    module, optimizer, loader = build(digits_train, mechanism, **noise_keywords(mechanism, 1.0))
    engine = optimizer.privacy_engine
    for name, acc in engine.accountants.items():
        assert acc.steps == 0
        assert acc.get_epsilon(1e-5) == pytest.approx(epsilon_of_events(name, engine.step_event, steps=0, delta=1e-5,
                                                                        releases=(RELEASE,)))
        assert acc.get_epsilon(1e-5) > 0
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 3)
    for name, acc in engine.accountants.items():
        assert acc.steps == 3
        with_release = epsilon_of_events(name, engine.step_event, steps=3, delta=1e-5, releases=(RELEASE,))
        assert acc.get_epsilon(1e-5) == pytest.approx(with_release)
        assert with_release > epsilon_of_events(name, engine.step_event, steps=3, delta=1e-5)


def test_calibration_and_budget_cover_the_release(digits_train):
    _, optimizer, _ = build(digits_train, target_epsilon=2.0, epochs=3)
    engine = optimizer.privacy_engine
    _, plain_optimizer, _ = build(digits_train, releases=(), target_epsilon=2.0, epochs=3)
    plain = plain_optimizer.privacy_engine
    assert engine.setup.noise > plain.setup.noise  # the release takes part of the budget
    planned = engine.planned_steps
    assert epsilon_of_events("gaussian", engine.step_event, steps=planned, delta=1e-5, releases=(RELEASE,)) <= 2.0
    assert epsilon_of_events("gaussian", engine.step_event, steps=engine.max_steps + 1, delta=1e-5,
                             releases=(RELEASE,)) > 2.0


def test_calibrated_noise_meets_the_target_in_dp_accounting():
    """Independent check: dp_accounting's PLD of the release composed with the calibrated steps."""
    dp_accounting = pytest.importorskip("dp_accounting")
    q, steps = 0.05, 200
    result = calibrate_noise("gaussian", 2.0, 1e-5, q, steps, releases=(RELEASE,))
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    reference.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(8.0), 4))
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(result.noise)), steps)
    assert reference.get_epsilon(1e-5) == pytest.approx(2.0, abs=0.02)


def test_a_release_alone_above_the_target_is_unreachable():
    with pytest.raises(UnreachableTargetError, match="releases before training alone cost epsilon=24"):
        calibrate_noise("gaussian", 1.0, 1e-5, 0.05, 100, releases=(SelfComposedEvent(GaussianEvent(0.5), 4),))


def test_quick_epsilon_and_the_budget_message_include_the_release(digits_train):
    _, optimizer, _ = build(digits_train, noise_multiplier=1.0)
    engine = optimizer.privacy_engine
    assert engine.get_quick_epsilon() >= engine.get_epsilon() > 0  # before any step: the release
    with pytest.raises(Exception, match="the data_releases alone cost 0.9"):
        build(digits_train, noise_multiplier=0.3, target_epsilon=1.0)


def test_laplace_steps_after_the_release_match_dp_accounting():
    """The laplace-l1 PLD route on release + steps against dp_accounting's own composition."""
    dp_accounting = pytest.importorskip("dp_accounting")
    q, steps, b = 0.02, 50, 4.0
    ours = epsilon_after("laplace-l1-pld", steps=steps, delta=1e-5, releases=(RELEASE,), sample_rate=q,
                         laplace_scale=b, clip=1.0)
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(dp_accounting.GaussianDpEvent(8.0 / 2))  # four Gaussians of sigma 8 = one of sigma 4
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.LaplaceDpEvent(b)), steps)
    assert ours == pytest.approx(reference.get_epsilon(1e-5), rel=0.01)


def test_checkpoint_records_the_releases(digits_train, tmp_path):
    module, optimizer, loader = build(digits_train, noise_multiplier=1.0)
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 2)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    again = build(digits_train, noise_multiplier=1.0)
    load_checkpoint(path, module=again[0], optimizer=again[1], engine=again[1].privacy_engine)
    assert again[1].privacy_engine.get_epsilon() == optimizer.privacy_engine.get_epsilon()
    without = build(digits_train, releases=(), noise_multiplier=1.0)
    with pytest.raises(CheckpointMismatchError, match="data_releases"):
        load_checkpoint(path, module=without[0], optimizer=without[1], engine=without[1].privacy_engine)


def test_checkpoint_whose_ledgers_lack_the_release_is_refused(digits_train, tmp_path):
    module, optimizer, loader = build(digits_train, noise_multiplier=1.0)
    engine = optimizer.privacy_engine
    train_steps(module, optimizer, endless_batches(loader), engine, 2)
    state = engine.state_dict()
    for acc_state in state["accountants"].values():
        acc_state["history"] = acc_state["history"][1:]  # the release removed, the steps kept
    again = build(digits_train, noise_multiplier=1.0)
    with pytest.raises(CheckpointMismatchError, match="ledger"):
        again[1].privacy_engine.load_state_dict(state)


@pytest.mark.parametrize("mechanism, releases, match", [
    ("dirichlet", (RELEASE,), "gradient mechanisms only"),
    ("penultimate-gaussian", (RELEASE,), "gradient mechanisms only"),
    ("gaussian", (PoissonSampledEvent(0.1, GaussianEvent(1.0)),), "no Poisson sampling"),
    ("gaussian", (ComposedEvent((RELEASE, PoissonSampledEvent(0.1, GaussianEvent(1.0)))),), "no Poisson sampling"),
    # sampled at rate 1 it is the same release, but the accountants would count it as a training step
    ("gaussian", (PoissonSampledEvent(1.0, GaussianEvent(8.0)),), "not a PoissonSampledEvent"),
    ("gaussian", (SelfComposedEvent(PoissonSampledEvent(1.0, GaussianEvent(8.0)), 4),), "not a PoissonSampledEvent"),
    ("gaussian", ("not an event",), "must be DP events"),
    ("gaussian", RELEASE, "data_releases must be a list or tuple"),
    ("gaussian", (DirichletEvent(0.5, 1.0),), "data_releases: accountant 'gaussian' cannot account"),
])
def test_releases_that_do_not_apply_are_refused(digits_train, mechanism, releases, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match=match):
            build(digits_train, mechanism, releases=releases, **noise_keywords(mechanism, 0.5))


@pytest.fixture(scope="module")
def mnist_available():
    from dpnoise.data import dataset_info, load_dataset

    try:
        load_dataset("mnist", "train", limit=10)
    except Exception as err:  # noqa: BLE001  (not installed here: make data)
        pytest.skip(f"mnist not installed: {err}")
    return dataset_info("mnist")


def test_cli_feature_statistics_with_the_cnn_head(mnist_available, capsys):
    pytest.importorskip("kymatio")
    assert main(["train", "--dataset", "mnist", "--model", "scatternet-cnn", "--mechanism", "lap2", "--noise", "0.5",
                 "--delta", "1e-5", "--epochs", "1", "--batch-size", "100", "--limit", "300", "--test-limit", "100",
                 "--max-steps", "1", "--feature-statistics-noise", "4", "--json", "--no-progress", "--threads", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["feature_statistics_noise"] == 4.0 and summary["steps"] == 1


def test_cli_feature_statistics_run_reports_them_and_their_cost(mnist_available, tmp_path, capsys):
    pytest.importorskip("kymatio")
    common = ["train", "--dataset", "mnist", "--model", "scatternet-linear", "--mechanism", "gaussian",
              "--noise", "1.0", "--delta", "1e-5", "--epochs", "1", "--batch-size", "100", "--limit", "300",
              "--test-limit", "100", "--max-steps", "2", "--json", "--no-progress", "--threads", "1"]
    assert main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*common, "--feature-statistics-noise", "4"]) == 0
    standardized = json.loads(capsys.readouterr().out)
    assert standardized["feature_statistics_noise"] == 4.0 and "feature_statistics_noise" not in plain
    for name, epsilon in standardized["epsilon_by_accountant"].items():
        assert epsilon > plain["epsilon_by_accountant"][name]
    assert standardized["steps"] == plain["steps"] == 2


@pytest.mark.parametrize("extra, flag", [
    (["--model", "cnn"], "--feature-statistics-noise applies to the models scatternet-linear, scatternet-cnn"),
    (["--model", "scatternet-linear", "--mechanism", "dirichlet"], "--feature-statistics-noise applies"),
    (["--model", "scatternet-linear", "--feature-statistics-noise", "-1"], "--feature-statistics-noise"),
    (["--model", "scatternet-linear", "--feature-statistics-noise", "nan"], "--feature-statistics-noise"),
])
def test_cli_refuses_feature_statistics_where_they_do_not_apply(capsys, extra, flag):
    argv = ["train", "--dataset", "mnist", "--mechanism", "gaussian", "--epsilon", "2", "--delta", "1e-5",
            "--epochs", "1", "--batch-size", "100", "--feature-statistics-noise", "4", *extra]
    assert main(argv) == 2  # a repeated flag: the last value wins, as argparse does
    assert flag in capsys.readouterr().err


def test_the_release_costs_little_next_to_training():
    """At Tramèr & Boneh's sigma = 8 the statistics cost a small part of epsilon 3 (CIFAR-10 recipe)."""
    release = SelfComposedEvent(GaussianEvent(8.0), 4)
    alone = epsilon_after("gaussian", steps=0, delta=1e-5, releases=(release,), noise_multiplier=1.0,
                          sample_rate=0.16)
    assert 0 < alone < 1.0
    assert math.isfinite(alone)
