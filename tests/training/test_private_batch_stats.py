"""Nothing computed from a private batch is published without noise unless asked for.

By default a run's outputs (``dpnoise train --out``: metrics.json, steps.csv, epochs.csv, curves.png and the
checkpoint's history) and its progress bar hold the steps, the epsilon, the sample rate and the evaluations on
held-out data; ``--log-private-batch-stats`` (``OutputConfig.log_private_batch_stats``) adds each step's loss,
batch accuracy and batch size, which are computed from the private batches without noise, with a warning.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import dpnoise
from dpnoise.cli.main import main
from dpnoise.training import DataConfig, OptimizerConfig, OutputConfig, PrivacyOptions, Schedule, TrainingConfig
from dpnoise.training.checkpoint import read_checkpoint
from dpnoise.training.pipeline import PRIVATE_BATCH_STATS_WARNING, progress_postfix, train_private
from dpnoise.training.report import PRIVATE_BATCH_STATS, EpochRecord, RunHistory, StepRecord, plot_curves

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

#: 8 steps of 64 of 512 digits, evaluated once on 100 held-out ones
ARGV = ["train", "--dataset", "digits", "--limit", "512", "--test-limit", "100", "--model", "cnn", "--mechanism",
        "gaussian", "--noise", "1", "--delta", "1e-5", "--epochs", "1", "--batch-size", "64", "--lr", "0.01",
        "--threads", "1", "--json"]
TINY = TrainingConfig(data=DataConfig("digits", limit=512, test_limit=100),
                      privacy=PrivacyOptions(mechanism="gaussian", noise=1.0, delta=1e-5, epochs=1),
                      schedule=Schedule(batch_size=64), optimizer=OptimizerConfig(lr=0.01),
                      output=OutputConfig(progress=False), threads=1)
#: what a step record publishes by default, and what an epoch record holds besides its epsilons
PUBLIC_STEP_FIELDS = ["step", "epoch", "epsilon"]
EPOCH_FIELDS = ["epoch", "step", "test_accuracy"]
#: the fields of a step record with its private batch's statistics, in the column order of steps.csv
LOGGED_STEP_FIELDS = ["step", "epoch", "loss", "batch_accuracy", "batch_size", "epsilon"]


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows) of a CSV file."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or ()), list(reader)


def step_fields(folder: Path) -> dict[str, list[list[str]]]:
    """The fields of every step record in each output of ``folder`` that holds them."""
    header, rows = csv_rows(folder / "steps.csv")
    checkpoint = read_checkpoint(folder / "checkpoint.pt")["extra"]["history"]
    return {"steps.csv": [header] * len(rows),
            "metrics.json": [list(s) for s in json.loads((folder / "metrics.json").read_text())["steps"]],
            "checkpoint.pt": [list(s) for s in checkpoint["steps"]]}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[Path, str, list[warnings.WarningMessage]]:
    """``dpnoise train --out`` with the progress bar on and nothing else asked: (its folder, its stderr, its
    warnings)."""
    folder = tmp_path_factory.mktemp("default") / "out"
    stderr = io.StringIO()
    with (warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(stderr),
          contextlib.redirect_stdout(io.StringIO())):
        warnings.simplefilter("always")
        assert main([*ARGV, "--out", str(folder)]) == 0
    return folder, stderr.getvalue(), caught


def test_by_default_no_output_file_holds_a_statistic_of_a_private_batch(default_run):
    folder, _, _ = default_run
    for name, records in step_fields(folder).items():
        assert records == [PUBLIC_STEP_FIELDS] * 8, name
    header, rows = csv_rows(folder / "epochs.csv")
    assert header[:3] == EPOCH_FIELDS and all(column.startswith("epsilon_") for column in header[3:])
    assert [int(row["step"]) for row in rows] == [8]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [list(e) for e in metrics["epochs"]] == [[*EPOCH_FIELDS, "epsilon_by_accountant"]]
    assert not set(metrics["summary"]) & {"loss", "batch_accuracy"}
    assert metrics["summary"]["batch_size"] == 64  # the expected batch size given, not a batch's size
    assert metrics["summary"]["sample_rate"] == 64 / 512


def test_by_default_the_progress_bar_shows_the_epsilon_only_and_nothing_is_warned(default_run):
    _, stderr, caught = default_run
    assert "eps=" in stderr and "loss=" not in stderr and "acc=" not in stderr
    assert not [w for w in caught if "log_private_batch_stats" in str(w.message)]


def test_with_the_option_the_command_line_prints_the_warning_once_and_logs_the_statistics(tmp_path):
    """A separate process, so that the warning is printed as it is outside the test runner."""
    folder = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dpnoise.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "dpnoise", *ARGV, "--out", str(folder), "--log-private-batch-stats"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"WARNING: {PRIVATE_BATCH_STATS_WARNING}") == 1
    assert "loss=" in done.stderr and "acc=" in done.stderr and "eps=" in done.stderr  # the progress bar
    for name, records in step_fields(folder).items():
        assert records == [LOGGED_STEP_FIELDS] * 8, name
    _, rows = csv_rows(folder / "steps.csv")
    assert all(0 <= float(row["batch_accuracy"]) <= 1 and float(row["loss"]) >= 0 for row in rows)
    assert all(0 <= int(row["batch_size"]) <= 512 for row in rows)  # Poisson batches of 512 digits


def test_a_resumed_run_keeps_the_checkpoints_statistics_only_with_the_option(tmp_path):
    """The library twin warns (a UserWarning); a run resumed without the option drops what its checkpoint logged."""
    logged = dataclasses.replace(TINY, schedule=Schedule(batch_size=64, max_steps=4),
                                 output=OutputConfig(folder=tmp_path, progress=False, log_private_batch_stats=True))
    with pytest.warns(UserWarning, match="computed from the private training batches without noise and are not "
                                         "covered by the epsilon"):
        first = train_private(logged)
    assert all(s.loss is not None and s.batch_size is not None for s in first.history.steps)
    checkpoint = tmp_path / "checkpoint.pt"
    assert [list(s) for s in read_checkpoint(checkpoint)["extra"]["history"]["steps"]] == [LOGGED_STEP_FIELDS] * 4
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="log_private_batch_stats")
        resumed = train_private(dataclasses.replace(TINY, output=OutputConfig(folder=tmp_path, resume=checkpoint,
                                                                              progress=False)))
    assert [s.step for s in resumed.history.steps] == list(range(1, 9))
    assert all(s.loss is None and s.batch_accuracy is None and s.batch_size is None for s in resumed.history.steps)
    for name, records in step_fields(tmp_path).items():
        assert records == [PUBLIC_STEP_FIELDS] * 8, name


def step(number: int, **stats) -> StepRecord:
    return StepRecord(number, number / 8, epsilon=0.1234 * number, **stats)


def test_the_progress_bar_shows_the_statistics_of_the_steps_that_hold_them():
    assert progress_postfix([step(1), step(2)]) == {"eps": "0.247"}  # rounded up
    logged = [step(1, loss=1.0, batch_accuracy=0.25, batch_size=60), step(2, loss=2.0, batch_accuracy=0.5,
                                                                          batch_size=70)]
    assert progress_postfix(logged) == {"loss": "1.500", "acc": "0.375", "eps": "0.247"}
    assert progress_postfix([step(1), *logged[1:]]) == {"loss": "2.000", "acc": "0.500", "eps": "0.247"}


def test_a_step_record_gives_its_private_batch_s_statistics_only_where_it_holds_them():
    assert list(step(1).to_dict()) == PUBLIC_STEP_FIELDS
    assert list(step(1, loss=1.0, batch_accuracy=0.5, batch_size=64).to_dict()) == LOGGED_STEP_FIELDS
    data = {"steps": [step(1, loss=1.0, batch_accuracy=0.5, batch_size=64).to_dict()], "epochs": []}
    assert RunHistory.from_dict(data, private_batch_stats=False).steps == [step(1)]
    assert RunHistory.from_dict(data, private_batch_stats=True).to_dict() == data
    assert set(PRIVATE_BATCH_STATS) == set(LOGGED_STEP_FIELDS) - set(PUBLIC_STEP_FIELDS)


@pytest.mark.parametrize("stats,curves", [
    ({}, ["test", "primary accountant (per step: quick bound)", "gaussian"]),
    ({"loss": 1.0, "batch_accuracy": 0.5, "batch_size": 64},
     ["training batch (no noise, outside epsilon)", "test", "primary accountant (per step: quick bound)", "gaussian"]),
], ids=["default", "logged"])
def test_the_curves_draw_the_training_batch_accuracy_only_where_the_steps_hold_it(stats, curves, tmp_path,
                                                                                   monkeypatch):
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(
        [line.get_label() for axes in figure.axes for line in axes.lines]))
    history = RunHistory([step(n, **stats) for n in (1, 2)], [EpochRecord(0.25, 2, 0.5, {"gaussian": 0.2})])
    plot_curves(tmp_path / "curves.png", history, "gaussian on digits")
    assert drawn == [curves]
