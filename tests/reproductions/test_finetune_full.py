"""The full fine-tuning plan (``finetune-full``): its runs, their command lines and its summary table (no training)."""

from __future__ import annotations

import pytest

from reproductions import plans, runner
from reproductions.cli import main
from reproductions.records import RunSpec, mean_std
from reproductions.tables import finetune_full_summary_markdown


def test_plan_runs_every_column_at_the_epsilons_in_the_given_order_with_the_same_settings():
    specs = plans.finetune_full_specs(["sst2"], [3.74, 0.54], seeds=[0])
    assert [(s.target_epsilon, s.calibrated_with) for s in specs] == [
        (eps, c.calibrated_with) for eps in (3.74, 0.54) for c in plans.FINETUNE_FULL_COLUMNS]
    assert {(s.model, s.trainable, s.max_length, s.eval_split, s.steps, s.batch_size, s.clip, s.lr)
            for s in specs} == {("minilm", "all", 32, "dev", plans.FINETUNE_FULL_STEPS, 128, 0.1, 5e-4)}
    assert len({s.name for s in specs}) == len(specs)
    assert specs[0].name.endswith("_train-all_L32_eval-dev_seed0")


def test_specs_without_the_text_fields_keep_their_record_names():
    spec = RunSpec(experiment="finetune", dataset="sst2", model="minilm-features", mechanism="gaussian",
                   calibrated_with="gaussian-rdp", target_epsilon=0.54, seed=0, steps=660, batch_size=1024, lr=2e-3)
    assert spec.name == "sst2_minilm-features_gaussian_cal-gaussian-rdp_eps0.54_T660_B1024_adam_lr0.002_seed0"


def test_recorded_command_builds_the_configuration_the_runner_trains(tmp_path):
    from dpnoise.cli.main import build_parser
    from dpnoise.cli.train import configuration_fields
    from dpnoise.training import TrainingConfig

    spec = plans.finetune_full_specs(["sst2"], [0.54], seeds=[1], steps=7)[2]
    argv = runner.train_argv(spec, tmp_path / "out")
    assert argv[argv.index("--trainable") + 1] == "all" and argv[argv.index("--eval-split") + 1] == "dev"
    config = runner.train_config(spec, tmp_path / "out")
    assert (config.trainable, config.data.max_length, config.data.eval_split) == ("all", 32, "dev")
    args = build_parser().parse_args(["train", *argv])
    assert TrainingConfig.from_fields(configuration_fields(args)) == config


def test_dry_run_lists_the_plan(capsys, tmp_path):
    assert main(["--experiment", "finetune-full", "--dataset", "sst2", "--seeds", "0", "--epsilons", "3.74", "0.54",
                 "--dry-run", "--results-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and all(line.startswith("todo  sst2_minilm_") for line in lines)


def test_cifar10_runs_fine_tune_efficientnet_at_the_papers_sampling_rate(tmp_path):
    from dpnoise.cli.main import build_parser
    from dpnoise.cli.train import configuration_fields
    from dpnoise.training import TrainingConfig

    specs = plans.finetune_full_specs(["cifar10-jpeg"], None, seeds=[0])
    assert [s.target_epsilon for s in specs] == [0.75] * 4 + [0.5] * 4
    assert {(s.model, s.resolution) for s in specs} == {("efficientnet-lite0", 64)}
    assert all(abs(s.batch_size / s.train_limit - 0.01668) < 1e-4 for s in specs)
    assert specs[0].name.endswith("_N10000_px64_seed0")
    argv = runner.train_argv(specs[1], tmp_path / "out")
    assert argv[argv.index("--resolution") + 1] == "64"
    args = build_parser().parse_args(["train", *argv])
    assert TrainingConfig.from_fields(configuration_fields(args)) == runner.train_config(specs[1], tmp_path / "out")


def aggregated(column: plans.Column, accuracy: float, noise: float, eps: float, trainable: str = "all",
               params: int = 22_713_986, dataset: str = "sst2") -> dict:
    mean, std = mean_std([accuracy])
    return dict(dataset=dataset, target_epsilon=eps, mechanism=column.mechanism, calibrated_with=column.calibrated_with,
                status="ok", seeds=[0], accuracies=[accuracy], accuracy_mean=mean, accuracy_std=std, n_seeds=1,
                noise=noise, clip=0.1, trainable=trainable, params=params)


def test_summary_sets_the_papers_table_iii_below_ours_and_pairs_lap2_with_gaussian():
    gaussian, lap2 = plans.FINETUNE_FULL_COLUMNS[:2]
    rows = [aggregated(gaussian, 0.80, 1.0, 3.74), aggregated(lap2, 0.75, 0.11, 3.74),  # absolute b: b/C = 1.1
            aggregated(gaussian, 0.7, 2.0, 0.54)]
    lines = finetune_full_summary_markdown(rows).splitlines()
    assert "| SST-2 | ε = 3.74 | ε = 0.54 |" in lines
    ours = lines.index("| Gaussian | 80.00 (n=1), σ = 1 | 70.00 (n=1), σ = 2 |")
    assert lines[ours + 1] == "| *↳ paper* | 90.31 | 87.16 |"
    assert "| Lap2 (b from sound lap2) | 75.00 (n=1), b/C = 1.1 | — |" in lines
    assert "| Lap2 − Gaussian | -5.00 (0/1 seeds ahead); noise +10.0% | — |" in lines
    assert not any(line.startswith("| Laplace-L1") for line in lines)  # not run: left out


def test_summary_without_records_says_so():
    assert finetune_full_summary_markdown([]) == "(no runs yet)"


@pytest.mark.parametrize("argv", [["--dataset", "mnist"], ["--columns", "gaussian-rdp"]])
def test_options_outside_the_plan_are_refused(capsys, argv):
    assert main(["--experiment", "finetune-full", "--dry-run", *argv]) == 2
    assert argv[0] in capsys.readouterr().err


def test_each_set_of_trained_parameters_gets_its_own_table_every_parameter_first():
    gaussian = plans.FINETUNE_FULL_COLUMNS[0]
    rows = [aggregated(gaussian, 0.6, 1.0, 3.74, trainable="head", params=148_610), aggregated(gaussian, 0.5, 1.0, 3.74)]
    text = finetune_full_summary_markdown(rows)
    full, head = text.index("**SST-2, MiniLM-L6, every parameter (22,713,986 parameters trained)**"), text.index(
        "**SST-2, MiniLM-L6, --trainable head (148,610 parameters trained)**")
    assert full < head
    assert "60.00 (n=1)" in text[head:] and "60.00" not in text[:head]


def test_trainable_variant_names_its_records_and_is_refused_for_other_experiments(capsys, tmp_path):
    from dpnoise.models import TRAINABLE_PARTS
    from reproductions import cli

    assert cli.TRAINABLE_CHOICES == TRAINABLE_PARTS
    assert main(["--experiment", "finetune-full", "--seeds", "0", "--epsilons", "3.74", "--trainable", "head",
                 "--dry-run", "--results-dir", str(tmp_path)]) == 0
    assert all("_train-head_" in line for line in capsys.readouterr().out.splitlines())
    assert main(["--experiment", "table2", "--dry-run", "--trainable", "head"]) == 2
    assert "--trainable" in capsys.readouterr().err


def test_figure_reference_line_is_the_not_private_run_of_the_same_task_and_length(tmp_path):
    import json

    from reproductions.reports import FINETUNE_FULL_REFERENCE_DIR, finetune_full_reference

    assert finetune_full_reference(tmp_path, "sst2", 30) == {}
    folder = tmp_path / FINETUNE_FULL_REFERENCE_DIR
    folder.mkdir(parents=True)
    for name, trainable, steps, accuracy in [("all", "all", 30, 0.75), ("head", "head", 30, 0.5),
                                             ("all_T300", "all", 300, 0.8), ("lora_T300", "lora", 300, 0.7)]:
        summary = {"dataset": "sst2", "trainable": trainable, "planned_steps": steps, "steps": steps,
                   "noise": 0.001, "test_accuracy": accuracy}
        (folder / f"sigma0.001_train-{name}.json").write_text(json.dumps({"summary": summary}))
    assert finetune_full_reference(tmp_path, "sst2", 30) == {"sst2": ("not private (σ 0.001), same 30 steps", 75.0)}
    assert finetune_full_reference(tmp_path, "sst2", 300) == {"sst2": ("not private (σ 0.001), same 300 steps", 80.0)}
    assert finetune_full_reference(tmp_path, "sst2", 300, "lora") == {
        "sst2": ("not private (σ 0.001), same 300 steps", 70.0)}
    assert finetune_full_reference(tmp_path, "sst2", 600) == {}
    assert finetune_full_reference(tmp_path, "cifar10-jpeg", 30) == {}


def test_each_run_length_gets_its_own_table_the_fewest_steps_first():
    gaussian = plans.FINETUNE_FULL_COLUMNS[0]
    rows = [dict(aggregated(gaussian, 0.73, 0.5, 3.74), steps_planned=300),
            dict(aggregated(gaussian, 0.51, 1.0, 3.74), steps_planned=30)]
    text = finetune_full_summary_markdown(rows)
    short, long = (text.index(f"**SST-2, MiniLM-L6, every parameter (22,713,986 parameters trained), T = {t} steps**") for t in (30, 300))
    assert short < long and "73.00 (n=1)" in text[long:] and "73.00" not in text[:long]


def test_each_task_gets_its_own_tables_and_note_sst2_first():
    gaussian = plans.FINETUNE_FULL_COLUMNS[0]
    rows = [aggregated(gaussian, 0.3, 2.0, 0.75, trainable=None, params=3_383_818, dataset="cifar10-jpeg"),
            aggregated(gaussian, 0.5, 1.0, 3.74)]
    text = finetune_full_summary_markdown(rows)
    sst2 = text.index("**SST-2, MiniLM-L6, every parameter")
    cifar = text.index("**CIFAR-10, EfficientNet-Lite0, every parameter (3,383,818 parameters trained)**")
    assert sst2 < cifar and "30.00 (n=1)" in text[cifar:] and "30.00" not in text[:cifar]
    assert "SST-2 dev accuracy" in text and "CIFAR-10 (JPEG copy) test accuracy" in text
    assert "97.17" in text[cifar:]  # the paper's ViT, Gaussian at eps 0.75


def test_each_choice_of_trained_parameters_gets_its_own_figure(tmp_path, monkeypatch):
    from reproductions import reports

    drawn = {}

    def draw(rows, datasets, columns, published, out, title, references=None):
        drawn[out.name] = rows, title, references
        return out

    monkeypatch.setattr(reports.figures, "accuracy_vs_epsilon", draw)
    gaussian = plans.FINETUNE_FULL_COLUMNS[0]
    planned = plans.FINETUNE_FULL_TASKS["sst2"][0]["steps"]
    full = dict(aggregated(gaussian, 0.73, 0.5, 3.74), steps_planned=planned)
    lora = dict(aggregated(gaussian, 0.76, 0.5, 3.74, trainable="lora", params=74_498), steps_planned=900)
    for trainable, steps in [("all", planned), ("lora", 900)]:
        reports.finetune_full_figure([full, lora], "sst2", trainable, steps, tmp_path, tmp_path)
    rows, title, _ = drawn["finetune_full_accuracy_vs_epsilon_lora_T900.png"]
    assert rows == [lora] and "lora (74,498 parameters) trained, T = 900" in title
    rows, title, _ = drawn["finetune_full_accuracy_vs_epsilon.png"]
    assert rows == [full] and "all 22.7M trained" in title
