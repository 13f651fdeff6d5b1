"""Shared helpers for the command-line bad-input tests (dpnoise and the reproduction runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import pytest

BAD_POSITIVE = ["0", "-1", "nan", "inf", "-inf"]
BAD_DELTA = ["0", "1", "-1e-5", "1.5", "nan", "inf"]
BAD_RATE = ["0", "-0.1", "1.5", "nan", "inf"]
BAD_COUNT = ["0", "-1"]


def cases(flag: str, values: list[str]) -> list:
    return [pytest.param(flag, v, id=f"{flag}={v}") for v in values]


def with_option(argv: list[str], flag: str, value: Optional[str]) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replaced if present, appended otherwise; None: removed)."""
    argv = list(argv)
    if flag in argv:
        i = argv.index(flag)
        del argv[i:i + 2]
    return argv if value is None else [*argv, flag, value]


def run_main(capsys, main: Callable, argv: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of ``main(argv)``; argparse's own errors exit."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def assert_one_line_refusal(capsys, main: Callable, argv: list[str], prefix: str, flag: str) -> str:
    """Exit status 2, nothing on stdout, one stderr line starting with ``prefix`` and naming ``flag``."""
    code, out, err = run_main(capsys, main, argv)
    assert code == 2, (argv, out, err)
    assert len(err) == 1, err
    assert err[0].startswith(prefix), err[0]
    assert flag in err[0], err[0]
    assert out == ""
    return err[0]


def refused_value(check: tuple, tmp_path: Path) -> Any:
    """A value that the declared check of a configuration field (``Option.check``: a
    :mod:`dpnoise.checks` name and its extra arguments) refuses."""
    name, *extra = check
    if name in ("existing_folder", "output_folder", "checkpoint_file"):
        not_a_checkpoint = tmp_path / "not-a-checkpoint.pt"
        not_a_checkpoint.write_text("text")
        return tmp_path / "missing" if name == "existing_folder" else not_a_checkpoint  # a file is no folder
    if name == "check_count":
        return extra[0] - 1  # below the minimum
    if name == "count_in":
        return extra[1] + 1  # above the maximum
    refused = {"check_positive": 0.0, "check_accounted": 1e308, "check_delta": 1.0, "fraction": 1.0, "nonnegative": -1.0, "open_fraction": 0.0,
               "seed": -1}
    return refused[name]  # a KeyError: a new kind of check needs a refused value here
