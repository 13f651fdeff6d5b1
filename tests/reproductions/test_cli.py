"""The reproduction runner's command line refuses invalid options before any work."""

from __future__ import annotations

import pytest

from reproductions.cli import main

from cli_refusals import BAD_COUNT, BAD_POSITIVE, assert_one_line_refusal, cases, with_option


def assert_refused(capsys, argv: list[str], flag: str) -> None:
    assert_one_line_refusal(capsys, main, argv, "python -m reproductions: error: ", flag)


DRY_RUN = ["--experiment", "table2", "--dry-run"]


@pytest.fixture
def no_runs(monkeypatch):
    """Starting runs or drawing reports fails the test."""
    import reproductions.reports
    import reproductions.runner

    def forbidden(*args, **kwargs):
        raise AssertionError("reproduce did work before its options were checked")

    monkeypatch.setattr(reproductions.runner, "run_specs", forbidden)
    monkeypatch.setattr(reproductions.reports, "accounting_figures", forbidden)
    monkeypatch.setattr(reproductions.reports, "write_aggregates", forbidden)


@pytest.mark.parametrize("flag,value", [
    *cases("--epsilons", BAD_POSITIVE),
    *cases("--steps", BAD_COUNT),
    *cases("--seeds", ["-1", str(2**32)]),
    *cases("--threads", BAD_COUNT),
    *cases("--jobs", BAD_COUNT),
    *cases("--dataset", ["foo", "sst2"]),
    *cases("--columns", ["foo", "dirichlet"]),
    *cases("--models", ["foo", "scatternet-cnn"]),
    *cases("--feature-statistics-noise", BAD_POSITIVE),
])
def test_dry_run_refuses(capsys, tmp_path, no_runs, flag, value):
    figures = tmp_path / "figures"
    argv = [*DRY_RUN, "--results-dir", str(tmp_path / "results"), "--figures-dir", str(figures), flag, value]
    assert_refused(capsys, argv, flag)
    assert not figures.exists()


def test_finetune_datasets(capsys, no_runs):
    assert_refused(capsys, ["--experiment", "finetune", "--dry-run", "--dataset", "mnist"], "--dataset")


@pytest.mark.parametrize("flag", ["--results-dir", "--figures-dir", "--work-dir", "--page"])
def test_output_folders_checked_before_any_run(capsys, tmp_path, no_runs, flag):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    argv = ["--experiment", "table2", "--quick", "--dataset", "mnist",
            "--results-dir", str(tmp_path / "results"), "--figures-dir", str(tmp_path / "figures"),
            "--work-dir", str(tmp_path / "work"), "--page", str(tmp_path / "missing.md")]
    assert_refused(capsys, with_option(argv, flag, str(a_file / "sub")), flag)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_dry_run_writes_nothing(capsys, tmp_path, no_runs):
    figures = tmp_path / "figures"
    for experiment in ("table2", "figures"):
        assert main(["--experiment", experiment, "--dry-run", "--quick", "--dataset", "mnist",
                     "--results-dir", str(tmp_path / "results"), "--figures-dir", str(figures)]) == 0
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()


def test_light_choice_lists_match_the_plans():
    from reproductions import cli, plans, runner

    assert cli.EXPERIMENT_CHOICES == tuple(plans.EXPERIMENTS)
    assert cli.DEFAULT_THREADS == runner.DEFAULT_THREADS


def test_building_the_parser_imports_no_torch():
    import subprocess
    import sys

    code = "import sys\nfrom reproductions.cli import build_parser\nbuild_parser()\nprint('torch' in sys.modules)\n"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
