"""Finished runs' per-step training logs in windows of steps: when a run leaves the majority-class plateau.

A run writes ``steps.csv`` (loss and accuracy of the model on each private batch, before that step's
update: the runner passes ``--log-private-batch-stats``) into its folder in ``--work-dir``.  For each
record of ``--experiment`` this tool keeps a copy of that log in
``<results-dir>/<experiment>/steps/<name>.csv`` (the run folders are not kept) and
prints one markdown row per run: the mean of ``--column`` over consecutive windows of ``--window``
steps, and the first step at which the mean over the last ``--window`` steps reaches ``--level``.

These are diagnostics of training: they are computed on the private batches without noise and
are not covered by the run's epsilon (the data sets here are public).  E.g. the 300-step SST-2 runs:

    .venv/bin/python -m reproductions.tools.step_windows --experiment finetune-full --only T300 --window 30 \
        --level 0.65
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from dpnoise import checks
from reproductions.tools import add_finished_run_options, finished_records


def window_means(values: Sequence[float], window: int) -> np.ndarray:
    """Means of ``values`` over consecutive windows of ``window`` (the last one may be shorter)."""
    values = np.asarray(values, dtype=float)
    return np.array([values[start:start + window].mean() for start in range(0, len(values), window)])


def first_step_reaching(steps: Sequence[int], values: Sequence[float], window: int, level: float) -> Optional[int]:
    """The first step whose mean of ``values`` over the last ``window`` steps is >= ``level`` (None if never)."""
    rolling = np.convolve(np.asarray(values, dtype=float), np.ones(window) / window, mode="valid")
    reached = np.flatnonzero(rolling >= level)
    return int(steps[reached[0] + window - 1]) if reached.size else None


def kept_log(name: str, experiment: str, results_dir: Path, work_dir: Path) -> Optional[Path]:
    """The run's kept copy of its log, copied from its run folder first if that still exists."""
    kept = results_dir / experiment / "steps" / f"{name}.csv"
    written = work_dir / experiment / name / "steps.csv"
    if written.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(written, kept)
    return kept if kept.is_file() else None


def read_log(path: Path, column: str) -> tuple[list[int], list[float]]:
    """(steps, values of ``column``) of a ``steps.csv``."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and column not in rows[0]:
        raise checks.InvalidParameterError(f"--column {column!r} is not in {path} (columns: {', '.join(rows[0])})")
    return [int(r["step"]) for r in rows], [float(r[column]) for r in rows]


def windowed_rows(args: argparse.Namespace) -> list[tuple[str, np.ndarray, object]]:
    """(name, window means, first step reaching the level or "never") of every chosen run with a log."""
    rows = []
    for record in finished_records(args):
        log = kept_log(record["name"], args.experiment, args.results_dir, args.work_dir)
        if log is None:
            print(f"skipped {record['name']}: no steps.csv kept or in its run folder", file=sys.stderr)
            continue
        steps, values = read_log(log, args.column)
        reached = first_step_reaching(steps, values, args.window, args.level)
        rows.append((record["name"], window_means(values, args.window), "never" if reached is None else reached))
    return rows


def print_table(rows: list[tuple[str, np.ndarray, object]], args: argparse.Namespace) -> None:
    """The markdown table of :func:`windowed_rows`, under one line saying what it shows."""
    windows = max((len(means) for _, means, _ in rows), default=0)
    print(f"Mean {args.column} over windows of {args.window} steps; *reaches*: the first step whose mean over "
          f"the last {args.window} steps is >= {args.level}.\n")
    print("| run | " + " | ".join(f"{1 + i * args.window}–{(i + 1) * args.window}" for i in range(windows))
          + " | reaches |")
    print("|---" * (windows + 2) + "|")
    for name, means, reached in rows:
        cells = [f"{m:.2f}" for m in means] + [""] * (windows - len(means))
        print(f"| {name} | " + " | ".join(cells) + f" | {reached} |")


def main(argv: list[str] | None = None) -> int:
    parser = checks.OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_finished_run_options(parser)
    parser.add_argument("--column", default="batch_accuracy", help="the logged quantity (default batch_accuracy; "
                        "also loss)")
    parser.add_argument("--window", type=int, default=30, help="steps per window (default 30)")
    parser.add_argument("--level", type=float, default=0.65,
                        help="the windowed mean a run must reach, finite and >= 0 (default 0.65)")
    args = parser.parse_args(argv)
    try:
        checks.check_count("--window", args.window, 1)
        checks.nonnegative("--level", args.level)
        rows = windowed_rows(args)
    except checks.InvalidParameterError as err:
        parser.error(str(err))
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
