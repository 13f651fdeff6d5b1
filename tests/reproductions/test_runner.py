"""The reproduction runner on a tiny configuration (digits, a few steps): records, skipping, aggregation."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from dpnoise.accounting import OUTPUT_PRIVACY_SCOPE
from reproductions.cli import main
from reproductions import runner
from reproductions.records import RunSpec, aggregate, load_records, record_path
from reproductions.runner import claim, run_spec, train_argv
from reproductions.tables import first_step_reaching, table2_markdown

pytestmark = pytest.mark.filterwarnings("ignore::dpnoise.accounting.UnsoundAccountantWarning")

TINY = dict(experiment="tiny", dataset="digits", model="cnn", target_epsilon=2.0, steps=12, batch_size=64)


def lap2_paper_spec(seed: int) -> RunSpec:
    return RunSpec(mechanism="lap2", calibrated_with="lap2-paper", seed=seed, **TINY)


@pytest.fixture(scope="module")
def lap2_records(tmp_path_factory):
    """Two seeds of a Lap2 run calibrated by the paper's accountant."""
    root = tmp_path_factory.mktemp("experiments")
    paths = [run_spec(lap2_paper_spec(seed), root / "results", root / "work") for seed in (0, 1)]
    return root, [json.loads(p.read_text()) for p in paths]


def test_record_has_every_required_field(lap2_records):
    _, (record, _) = lap2_records
    for key in ("dataset", "model", "mechanism", "calibrated_with", "target_epsilon", "noise", "clip",
                "epsilon_by_accountant", "accuracy", "steps", "wall_time_s", "optimizer", "command", "git_commit"):
        assert key in record, key
    assert record["status"] == "ok" and record["steps"] == record["steps_planned"] == 12
    assert 0.0 <= record["accuracy"] <= 1.0
    assert record["curve"][-1]["step"] == 12
    assert record["grad_sample_mode"] == "bookkeeping"  # the seed CNN's layers all support it


def test_paper_calibrated_lap2_also_reports_the_sound_epsilon(lap2_records):
    _, (record, _) = lap2_records
    eps = record["epsilon_by_accountant"]
    assert set(eps) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    assert eps["lap2-paper"] <= record["target_epsilon"] + 1e-9
    assert record["sound_by_accountant"] == {"lap2": True, "lap2-rdp": True, "lap2-gdp": True, "lap2-paper": False}


def test_recorded_command_is_the_train_invocation(lap2_records):
    root, (record, _) = lap2_records
    words = shlex.split(record["command"])
    assert words[:2] == ["dpnoise", "train"]
    assert words[2:] == train_argv(lap2_paper_spec(0), root / "work" / "tiny" / lap2_paper_spec(0).name)
    assert words[words.index("--calibrate-with") + 1] == "lap2-paper"


def test_existing_record_is_skipped(lap2_records):
    root, _ = lap2_records
    path = record_path(root / "results", lap2_paper_spec(0))
    before = path.read_text()
    assert run_spec(lap2_paper_spec(0), root / "results", root / "work") is None
    assert path.read_text() == before


def test_aggregate_mean_and_std_over_seeds(lap2_records):
    root, records = lap2_records
    (row,) = aggregate(load_records(root / "results", "tiny"))
    accuracies = [r["accuracy"] for r in records]
    assert row["n_seeds"] == 2 and row["seeds"] == [0, 1]
    assert row["accuracy_mean"] == pytest.approx(sum(accuracies) / 2)
    assert row["accuracy_std"] == pytest.approx(abs(accuracies[0] - accuracies[1]) / 2 ** 0.5)


def test_markdown_table_shows_ours_next_to_the_seed(lap2_records):
    root, _ = lap2_records
    rows = [dict(r, target_epsilon=3.42, dataset="mnist") for r in aggregate(load_records(root / "results", "tiny"))]
    table = table2_markdown(rows, ["mnist"])
    assert "| 3.42 | Lap2 (b from lap2-paper) |" in table and "96.82" in table and "lap2-paper*" in table


def test_dirichlet_run_carries_the_scope_and_unreachable_target_is_recorded(tmp_path):
    spec = RunSpec(mechanism="dirichlet", calibrated_with="dirichlet", seed=0, alpha=1.0,
                   **{**TINY, "experiment": "tiny-dirichlet"})
    record = json.loads(run_spec(spec, tmp_path, tmp_path / "work").read_text())
    assert record["scope"] == OUTPUT_PRIVACY_SCOPE and record["grad_sample_mode"] is None
    below_floor = RunSpec(**{**spec.to_dict(), "target_epsilon": 0.01})
    record = json.loads(run_spec(below_floor, tmp_path, tmp_path / "work").read_text())
    assert record["status"] == "unreachable" and "floor" in record["reason"]
    assert record["target_epsilon"] == 0.01
    (unreachable,) = [r for r in aggregate(load_records(tmp_path, "tiny-dirichlet")) if r["status"] != "ok"]
    assert "accuracy_mean" not in unreachable


def test_reproduce_dry_run_lists_quick_plan(capsys):
    assert main(["--experiment", "table2", "--dataset", "mnist", "--quick", "--dry-run",
                 "--results-dir", "/nonexistent"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12  # 2 epsilons x 6 columns, one seed
    assert all(line.startswith("todo") and "_T5860_" in line and line.endswith("seed0") for line in lines)


def test_a_spec_running_in_another_live_process_is_skipped(tmp_path):
    spec = lap2_paper_spec(5)
    mark = record_path(tmp_path, spec).with_suffix(".running")
    mark.parent.mkdir(parents=True)
    mark.write_text(str(os.getppid()))  # a live process that is not this one
    assert run_spec(spec, tmp_path, tmp_path / "work") is None
    assert not record_path(tmp_path, spec).exists()
    mark.write_text("999999999")  # a dead holder: taken over
    assert claim(record_path(tmp_path, spec)) and mark.read_text() == str(os.getpid())


def test_convergence_table_counts_steps_to_the_first_evaluation_at_target():
    curve = [{"step": 10, "test_accuracy": 0.5}, {"step": 20, "test_accuracy": 0.95}, {"step": 30, "test_accuracy": 0.9}]
    assert first_step_reaching(curve, 95.0) == 20 and first_step_reaching(curve, 96.0) is None


def test_results_page_blocks_are_replaced_by_the_generated_tables(tmp_path):
    from reproductions.reports import splice_into_page, write_markdown

    table = write_markdown(tmp_path / "table2.md", "Table", "| a |\n|---|\n| 1 |")
    other = write_markdown(tmp_path / "other.md", "Other", "not on the page")
    page = tmp_path / "RESULTS.md"
    page.write_text("intro\n<!-- generated:table2 -->\nstale copy\n<!-- /generated:table2 -->\nprose\n")
    assert splice_into_page(page, [table, other, tmp_path / "figure.png"]) == ["table2"]
    text = page.read_text()
    assert "stale copy" not in text and "| 1 |" in text and "not on the page" not in text
    assert "## Table" not in text  # the title stays in the generated file
    assert text.endswith("<!-- /generated:table2 -->\nprose\n")


def test_a_folder_of_results_pages_gets_each_table_on_the_page_that_holds_its_block(tmp_path):
    from reproductions.reports import splice_into_pages, write_markdown

    reports, pages = tmp_path / "reports", tmp_path / "results"
    pages.mkdir()
    table = write_markdown(reports / "summary_table2.md", "Table II", "| a |\n|---|\n| 1 |")
    other = write_markdown(reports / "summary_dirichlet.md", "Dirichlet", "| b |\n|---|\n| 2 |")
    block = "<!-- generated:{0} -->\nstale\n<!-- /generated:{0} -->\n"
    (pages / "table2.md").write_text("# Table II\n" + block.format("summary_table2"))
    (pages / "dirichlet.md").write_text("# Dirichlet\n" + block.format("summary_dirichlet"))
    (pages / "notes.md").write_text("no blocks\n")
    spliced = splice_into_pages(pages, [table, other])
    assert spliced == {pages / "dirichlet.md": ["summary_dirichlet"], pages / "table2.md": ["summary_table2"]}
    assert "| 1 |" in (pages / "table2.md").read_text() and "| 2 |" not in (pages / "table2.md").read_text()
    assert "| 2 |" in (pages / "dirichlet.md").read_text()
    assert splice_into_pages(pages / "table2.md", [table]) == {pages / "table2.md": ["summary_table2"]}


def test_dirichlet_plan_uses_each_datasets_model_and_steps(capsys):
    assert main(["--experiment", "dirichlet", "--study", "comparison", "--dataset", "mnist",
                 "cifar10-jpeg", "--epsilons", "1", "--seeds", "0", "1", "--dry-run",
                 "--results-dir", "/nonexistent"]) == 0
    names = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert len(names) == 16 and [n.endswith("seed0") for n in names] == [True] * 8 + [False] * 8
    assert all(("_cnn_" in n and "_T704_" in n) or ("_resnet-gn-small_" in n and "_T391_" in n) for n in names)
    assert names[0].startswith("mnist_") and names[4].startswith("cifar10-jpeg_")


def test_parallel_jobs_write_every_record_once(tmp_path):
    from reproductions.runner import run_specs

    specs = [RunSpec(mechanism="gaussian", calibrated_with="gaussian", seed=seed, **{**TINY, "experiment": "jobs"})
             for seed in (0, 1)]
    written = run_specs(specs + specs[:1], tmp_path, tmp_path / "work", jobs=2)
    assert sorted(p.name for p in written) == sorted(record_path(tmp_path, s).name for s in specs)
    assert {json.loads(p.read_text())["seed"] for p in written} == {0, 1}
    assert not list(tmp_path.rglob("*.running"))
    with pytest.raises(ValueError, match="jobs"):
        run_specs(specs, tmp_path, tmp_path / "work", jobs=0)


def test_paper_calibrated_rows_get_an_exact_lower_bound_that_can_refute_them(tmp_path, monkeypatch):
    from dpnoise.accounting import calibrate_noise
    from reproductions import lower_bounds
    from reproductions.tables import format_epsilons

    setting = dict(sample_rate=0.05, steps=[50], params=200, clip=1.0, delta=1e-5, status="ok")
    paper_b = calibrate_noise("lap2-paper", 4.0, 1e-5, 0.05, 50, params=200).noise
    paper = dict(setting, calibrated_with="lap2-paper", target_epsilon=4.0, noise=paper_b,
                 epsilon_by_accountant={"lap2-paper": 4.0})
    gaussian = dict(setting, calibrated_with="gaussian", target_epsilon=4.0, noise=1.0,
                    epsilon_by_accountant={"gaussian": 4.0})
    annotated = lower_bounds.annotate_lower_bounds([paper, gaussian], tmp_path)
    lower = annotated[0]["lower_bound_epsilon"]
    assert lower > 4.0 and "claim refuted" in format_epsilons(annotated[0])
    assert "lower_bound_epsilon" not in annotated[1]
    monkeypatch.setattr(lower_bounds, "compute_lower_bound", lambda key: pytest.fail("cache not used"))
    assert lower_bounds.annotate_lower_bounds([paper], tmp_path)[0]["lower_bound_epsilon"] == lower
    assert load_records(tmp_path.parent, tmp_path.name) == []  # the cache is not a run record


def test_code_state_is_the_one_the_process_imported(tmp_path):
    """A worker keeps the code it imported: a later commit is not attributed to its runs."""
    import subprocess

    from reproductions.runner import git_state

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "first")
    first = git_state(tmp_path)
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    git("commit", "-qam", "second")
    assert git_state(tmp_path) == first and len(first["git_commit"]) == 40 and not first["git_src_dirty"]


def test_default_jobs_keep_every_usable_core_busy(monkeypatch):
    monkeypatch.setattr(runner, "usable_cores", lambda: 5)
    assert runner.default_jobs(threads=1) == 5
    assert runner.default_jobs(threads=2) == 2
    assert runner.default_jobs(threads=8) == 1


class StubEncoder:
    """Satisfies the FeatureClassifier protocol without loading any weights."""

    head = None
    feature_cache_tag = ("stub", "")

    def features(self, inputs):
        return inputs


def test_features_are_computed_once_per_dataset_and_model_before_parallel_runs(tmp_path, monkeypatch):
    import torch

    from dpnoise.training import preparation

    built_by_library = preparation.model_for_dataset
    monkeypatch.setattr(preparation, "model_for_dataset",
                        lambda config: StubEncoder() if config.model == "minilm-features" else built_by_library(config))
    computed = []
    monkeypatch.setattr(preparation, "frozen_features", lambda model, config: computed.append(
        (config.data.name, config.data.limit, torch.get_num_threads())))
    threads_before = torch.get_num_threads()
    head = dict(TINY, model="minilm-features", mechanism="gaussian", calibrated_with="gaussian")
    specs = [RunSpec(seed=0, **head), RunSpec(seed=1, **head), RunSpec(seed=0, **dict(head, train_limit=100)),
             RunSpec(mechanism="gaussian", calibrated_with="gaussian", seed=0, **TINY)]
    finished = record_path(tmp_path, specs[2])
    finished.parent.mkdir(parents=True)
    finished.write_text("{}")
    assert runner.warm_feature_caches(specs, tmp_path, tmp_path / "work", threads=2) == 1
    assert computed == [("digits", None, 2)]
    assert torch.get_num_threads() == threads_before


@pytest.mark.parametrize("spec", [
    lap2_paper_spec(3),
    RunSpec(mechanism="dirichlet", calibrated_with="dirichlet", seed=1, alpha=0.5, effective_lr=0.3, train_limit=500,
            test_limit=100, **{**TINY, "target_epsilon": 1.5}),
    RunSpec(mechanism="gaussian", calibrated_with="gaussian", seed=0, optimizer="sgd", lr=16.0, momentum=0.9,
            lr_schedule="cosine", ema_decay=0.999, physical_batch_size=2048, clip=0.1, **TINY),
    RunSpec(mechanism="gaussian", calibrated_with="gaussian", seed=0, feature_statistics_noise=8.0,
            **{**TINY, "model": "scatternet-linear"}),
], ids=["lap2-paper", "dirichlet", "recipe", "feature-statistics"])
def test_recorded_command_builds_the_configuration_the_runner_trains(spec, tmp_path):
    from dpnoise.cli.main import build_parser
    from dpnoise.cli.train import configuration_fields
    from dpnoise.training import TrainingConfig

    args = build_parser().parse_args(["train", *train_argv(spec, tmp_path / "out")])
    assert TrainingConfig.from_fields(configuration_fields(args)) == runner.train_config(spec, tmp_path / "out")


def test_evaluate_split_gives_back_the_recorded_accuracy_on_the_recorded_split(lap2_records):
    """The final checkpoint's model, rebuilt from the record and evaluated again: the same number."""
    from reproductions.tools.evaluate_split import main as evaluate_split

    root, (record, _) = lap2_records
    assert evaluate_split(["--experiment", "tiny", "--split", "test", "--only", "seed0",
                           "--results-dir", str(root / "results"), "--work-dir", str(root / "work")]) == 0
    (written,) = (root / "results" / "tiny" / "test-split").glob("*.json")
    evaluated = json.loads(written.read_text())
    assert evaluated["name"] == record["name"] and evaluated["accuracy"] == record["accuracy"]
    assert evaluated["examples"] == 360 and len(load_records(root / "results", "tiny")) == 2


def test_step_windows_keeps_each_runs_log_and_prints_its_windowed_means(lap2_records, capsys):
    """The tool copies a run's steps.csv beside the records and prints the windows of its batch accuracy."""
    from reproductions.tools.step_windows import main as step_windows

    root, (record, _) = lap2_records
    argv = ["--experiment", "tiny", "--only", "seed0", "--window", "5", "--level", "0",
            "--results-dir", str(root / "results"), "--work-dir", str(root / "work")]
    assert step_windows(argv) == 0
    kept = root / "results" / "tiny" / "steps" / f"{record['name']}.csv"
    logged = (root / "work" / "tiny" / record["name"] / "steps.csv").read_text()
    assert kept.read_text() == logged
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {record['name']} |")]
    (row,) = rows
    cells = row.strip("|").split("|")
    assert len(cells) == 1 + 3 + 1  # name, windows of steps 1-5, 6-10 and 11-12, first step reaching 0
    assert cells[-1].strip() == "5"  # any mean reaches level 0: after the first full window


def test_step_windows_means_and_first_step_reaching_a_level():
    from reproductions.tools.step_windows import first_step_reaching, window_means

    values = [0.5, 0.5, 0.5, 0.7, 0.9, 0.9, 0.8]
    assert window_means(values, 3).tolist() == pytest.approx([0.5, 2.5 / 3, 0.8])
    steps = list(range(1, 8))
    assert first_step_reaching(steps, values, window=2, level=0.8) == 5  # mean of steps 4-5 is 0.8
    assert first_step_reaching(steps, values, window=3, level=0.9) is None


@pytest.mark.parametrize("flags,named", [(["--window", "0"], "--window"), (["--level", "nan"], "--level"),
                                         (["--level", "-1"], "--level"), (["--column", "nope"], "--column")])
def test_step_windows_refuses_bad_options_in_one_line_naming_the_flag(lap2_records, capsys, flags, named):
    from reproductions.tools.step_windows import main as step_windows

    root, _ = lap2_records
    with pytest.raises(SystemExit) as stop:
        step_windows(["--experiment", "tiny", "--results-dir", str(root / "results"),
                      "--work-dir", str(root / "work"), *flags])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "error:" in line and named in line
