"""Private hyperparameter tuning: the plan's accounting, the law of the number of trials, a tuning run
that releases the best trial only, and the command line."""

import json
import math
import warnings

import numpy as np
import pytest

from dpnoise.accounting import InvalidParameterError
from dpnoise.accounting.rdp.conversion import epsilon_from_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.cli.main import main
from dpnoise.training.tuning import draw_trial_count, plan_tuning, trial_curve, tune_private, tuned_epsilon

BASE = {"data.name": "digits", "model": "cnn", "privacy.mechanism": "gaussian", "privacy.delta": 1e-5,
        "privacy.epochs": 2.0, "schedule.batch_size": 64, "threads": 1, "seed": 0}
GRID = {"optimizer.lr": [0.001, 0.003], "privacy.max_grad_norm": [0.5, 1.0]}


def quietly(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


@pytest.mark.parametrize("shape", [0.0, 1.0, math.inf])
def test_the_plan_spends_the_total_on_the_best_of_a_random_number_of_trials(shape):
    plan = quietly(lambda: plan_tuning(BASE, GRID, total_epsilon=3.0, trials_mean=4, trials_shape=shape))
    assert len(plan.candidates) == 4 and plan.rdp_accountant == "gaussian-rdp"
    assert 2.99 <= plan.total_epsilon <= 3.0 and plan.trial_epsilon < plan.total_epsilon
    # the single trial's curve is the largest over the candidates: each candidate's own total is within it
    for fields in plan.candidates:
        curve, _, noise = quietly(lambda fields=fields: trial_curve(fields, plan.trial_epsilon, DEFAULT_ORDERS))
        assert noise in plan.noises
        assert epsilon_from_rdp(DEFAULT_ORDERS, curve, 1e-5)[0] <= plan.total_epsilon
    more = quietly(lambda: tuned_epsilon(plan.candidates, plan.trial_epsilon, 1e-5, 8, shape)[0])
    assert more > plan.total_epsilon  # more trials on average cost more


def test_a_total_whose_thousandth_no_trial_reaches_is_planned():
    """The search starts at total / 1000; where a trial cannot reach that at any noise (an RDP accountant's floor,
    log(1/delta) / (largest order - 1)), it starts higher instead of failing."""
    few_steps = {**BASE, "privacy.epochs": 0.1, "schedule.batch_size": 8, "privacy.accountant": "gaussian-rdp",
                 "privacy.calibrate_with": "gaussian-rdp"}
    plan = quietly(lambda: plan_tuning(few_steps, GRID, total_epsilon=0.88, trials_mean=2))
    assert 0.87 <= plan.total_epsilon <= 0.88 and 0.00088 < plan.trial_epsilon < 0.88


def test_an_unreachable_total_is_refused():
    with pytest.raises(InvalidParameterError, match="unreachable"):
        quietly(lambda: plan_tuning(BASE, GRID, total_epsilon=0.05, trials_mean=50))


@pytest.mark.parametrize("shape", [0.0, 1.0, 2.5, math.inf])
def test_the_number_of_trials_has_the_asked_mean(shape):
    draws = np.array([draw_trial_count(5.0, shape, entropy=seed) for seed in range(4000)])
    assert abs(draws.mean() - 5.0) < 0.35 and (draws >= 1).all() == (not math.isinf(shape))
    if not math.isinf(shape):
        assert draw_trial_count(1.0, shape) == 1
    else:  # Poisson of mean 1: not always one trial
        assert {draw_trial_count(1.0, shape, entropy=seed) for seed in range(200)} > {1}


def test_tuning_releases_the_best_trial_only(tmp_path, capsys):
    result = quietly(lambda: tune_private(BASE, GRID, total_epsilon=3.0, trials_mean=2, trials_shape=1.0, entropy=3,
                                          output_folder=tmp_path / "best"))
    assert result.best is not None and set(result.best) == set(GRID)
    assert result.best_summary["epsilon"] <= result.plan.trial_epsilon + 1e-9
    assert result.best_score == result.best_summary["test_accuracy"]
    assert (tmp_path / "best" / "metrics.json").is_file() and not list(tmp_path.glob("trial-*"))
    summary = json.loads(json.dumps(result.summary()))
    assert "trials" in summary and set(summary["trials"]) == {"law", "mean", "shape"}  # the law, never K
    assert capsys.readouterr().err == ""  # the trials ran silently


def test_own_data_and_secure_mode_are_refused():
    with pytest.raises(InvalidParameterError, match="must be public"):
        tune_private({**BASE, "data.name": "csv:/some/file.csv"}, GRID, total_epsilon=3, trials_mean=2)
    with pytest.raises(InvalidParameterError, match="secure mode"):
        quietly(lambda: plan_tuning({**BASE, "privacy.secure_mode": True}, GRID, total_epsilon=3, trials_mean=2))


def test_the_command_line_takes_lists_as_the_grid(capsys):
    code = quietly(lambda: main(["tune", "--dataset", "digits", "--model", "cnn", "--mechanism", "gaussian", "--epsilon",
                                 "3", "--delta", "1e-5", "--epochs", "1", "--batch-size", "64", "--lr", "0.001,0.003",
                                 "--trials-mean", "1.5", "--trials-shape", "0", "--threads", "1", "--json"]))
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["candidates"] == 2 and summary["total_epsilon"] <= 3
    assert [row["fields"] for row in summary["candidate_noise"]] == [{"optimizer.lr": 0.001}, {"optimizer.lr": 0.003}]
    assert all(row["noise"] > 0 for row in summary["candidate_noise"])  # the calibration: each candidate's noise
    assert summary["trials"]["law"] == "logarithmic, mean 1.5"
    assert summary["best"] is None or set(summary["best"]) == {"optimizer.lr"}


class FakeRun:
    """What a trial's train_private returns, scored by its learning rate (no training: the job's logic only)."""

    def __init__(self, config):
        self.test_accuracy = config.optimizer.lr * 100
        self.summary = lambda: {"lr": config.optimizer.lr}


def test_a_killed_tuning_job_resumes_without_drawing_again_or_repeating_a_trial(tmp_path, monkeypatch):
    import dpnoise.training.pipeline as pipeline

    calls = []

    def killed_at_the_third(config):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(config.optimizer.lr)
        return FakeRun(config)

    state = tmp_path / "job.json"
    job = dict(total_epsilon=3.0, trials_mean=6, entropy=11, state_file=state)
    monkeypatch.setattr(pipeline, "train_private", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        quietly(lambda: tune_private(BASE, GRID, **job))
    saved = json.loads(state.read_text())
    assert saved["done"] == 2 and not saved["finished"] and saved["trials"] > 2

    def the_rest(config):
        calls.append(config.optimizer.lr)
        return FakeRun(config)

    monkeypatch.setattr(pipeline, "train_private", the_rest)
    result = quietly(lambda: tune_private(BASE, GRID, **{**job, "entropy": 99}))  # no new draw: the state's
    assert len(calls) == saved["trials"]  # each trial once, the killed one run again
    uninterrupted = []
    monkeypatch.setattr(pipeline, "train_private", lambda config: uninterrupted.append(config.optimizer.lr)
                        or FakeRun(config))
    fresh = quietly(lambda: tune_private(BASE, GRID, **{**job, "state_file": tmp_path / "fresh.json"}))
    assert uninterrupted == calls and result.best == fresh.best  # the same trials as a job never killed
    again = quietly(lambda: tune_private(BASE, GRID, **job))  # a finished job: no new search
    assert len(uninterrupted) == len(calls) and again.best == result.best and again.best_score == result.best_score


def test_another_jobs_state_is_refused(tmp_path, monkeypatch):
    import dpnoise.training.pipeline as pipeline

    monkeypatch.setattr(pipeline, "train_private", FakeRun)
    state = tmp_path / "job.json"
    quietly(lambda: tune_private(BASE, GRID, total_epsilon=3.0, trials_mean=2, entropy=1, state_file=state))
    with pytest.raises(InvalidParameterError, match="another tuning job's"):
        quietly(lambda: tune_private(BASE, GRID, total_epsilon=2.0, trials_mean=2, entropy=1, state_file=state))


def test_a_grid_over_a_mechanisms_option_tunes_it():
    """Dirichlet's alpha as a grid field (``privacy.options.alpha``): each candidate's noise is calibrated with its
    own alpha, and the plan covers the largest curve."""
    dirichlet = {**BASE, "privacy.mechanism": "dirichlet"}
    plan = quietly(lambda: plan_tuning(dirichlet, {"privacy.options.alpha": [0.5, 2.0]}, total_epsilon=3.0,
                                       trials_mean=2))
    assert [fields["privacy.options.alpha"] for fields in plan.candidates] == [0.5, 2.0]
    assert plan.noises[0] != plan.noises[1] and 2.99 <= plan.total_epsilon <= 3.0
