"""``dpnoise train`` end to end on digits: report, --json, --out files, resume, clear errors."""

import csv
import json

import pytest

from dpnoise.cli.main import main

COMMON = ["train", "--dataset", "digits", "--model", "cnn", "--delta", "1e-5", "--batch-size", "64",
          "--threads", "1", "--no-progress", "--seed", "0", "--noise-seed", "0"]


def test_json_report_for_lap2_has_both_accountants(capsys):
    assert main([*COMMON, "--mechanism", "lap2", "--epsilon", "2", "--epochs", "1", "--lr", "1e-2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("test_accuracy", "epsilon", "epsilon_by_accountant", "delta", "steps", "mechanism", "dataset"):
        assert key in report
    assert set(report["epsilon_by_accountant"]) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    assert report["epsilon"] == report["epsilon_by_accountant"]["lap2"] <= 2.0
    assert report["sound_by_accountant"] == {"lap2": True, "lap2-rdp": True, "lap2-gdp": True, "lap2-paper": False}
    assert report["steps"] == report["planned_steps"] == 23  # ceil(1 / q), q = 64 / 1437
    assert report["scope"] is None and 0.0 <= report["test_accuracy"] <= 1.0


def test_text_report_for_dirichlet_states_the_scope(capsys):
    assert main([*COMMON, "--mechanism", "dirichlet", "--epsilon", "3", "--epochs", "1", "--optimizer", "sgd",
                 "--effective-lr", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "test accuracy:" in out and "dirichlet:" in out
    assert "NOT a guarantee for the trained model's parameters" in out


#: the recipe options: SGD with momentum, a cosine schedule, a parameter average, physical batches
RECIPE_OPTIONS = ["--optimizer", "sgd", "--momentum", "0.9", "--lr-schedule", "cosine", "--ema-decay", "0.9",
                  "--physical-batch-size", "20"]


@pytest.mark.parametrize("options", [[], RECIPE_OPTIONS], ids=["plain", "recipe-options"])
def test_out_files_and_resume_continue_the_same_run(tmp_path, capsys, options):
    args = [*COMMON, "--mechanism", "gaussian", "--noise", "1.0", "--epochs", "2", "--lr", "1e-2", "--json", *options]
    assert main([*args, "--out", str(tmp_path / "full")]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*args, "--out", str(tmp_path / "part"), "--max-steps", "23"]) == 0
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "part"), "--resume", str(tmp_path / "part" / "checkpoint.pt")]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["steps"] == full["steps"] == 45  # ceil(2 / q)
    assert resumed["epsilon"] == full["epsilon"] and resumed["test_accuracy"] == full["test_accuracy"]
    for name in ("metrics.json", "steps.csv", "epochs.csv", "curves.png", "checkpoint.pt"):
        assert (tmp_path / "part" / name).stat().st_size > 0
    with (tmp_path / "part" / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == list(range(1, 46))
    metrics = json.loads((tmp_path / "part" / "metrics.json").read_text())
    assert [e["step"] for e in metrics["epochs"]] == [23, 45]


def test_missing_data_names_the_install_command(tmp_path, capsys):
    code = main(["train", "--dataset", "fashion-mnist", "--data-root", str(tmp_path), "--mechanism", "lap2",
                 "--epsilon", "1", "--delta", "1e-5", "--epochs", "1", "--batch-size", "256"])
    assert code == 2
    assert "apt-get install -y dataset-fashion-mnist" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--epsilon", "0.01", "--mechanism", "dirichlet"], "unreachable"),
    (["--mechanism", "lap2"], "give --epsilon"),
    (["--mechanism", "lap2", "--noise", "1", "--effective-lr", "0.1"], "--effective-lr applies"),
])
def test_bad_options_exit_with_a_clear_error(capsys, extra, message):
    assert main([*COMMON, "--epochs", "50", *extra]) == 2
    assert message in capsys.readouterr().err
