"""Finished runs' per-step training logs in windows of steps: when a run leaves the majority-class plateau.

A run writes ``steps.csv`` (loss and accuracy of the model on each private batch, before that step's
update) into its folder in ``--work-dir``.  For each record of ``--experiment`` this tool keeps a copy
of that log in ``<results-dir>/<experiment>/steps/<name>.csv`` (the run folders are not kept) and
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

from reproductions.cli import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR
from reproductions.records import load_records


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
        raise SystemExit(f"--column {column!r} is not in {path} (columns: {', '.join(rows[0])})")
    return [int(r["step"]) for r in rows], [float(r[column]) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True, help="the experiment whose runs are shown")
    parser.add_argument("--only", nargs="+", default=[],
                        help="only the records whose name contains each of these strings, e.g. T300 seed0")
    parser.add_argument("--column", default="batch_accuracy", help="the logged quantity (default batch_accuracy; "
                        "also loss)")
    parser.add_argument("--window", type=int, default=30, help="steps per window (default 30)")
    parser.add_argument("--level", type=float, default=0.65,
                        help="the windowed mean a run must reach (default 0.65)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="the records (and the copies)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="the runs' folders with their logs")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    chosen = [r for r in load_records(args.results_dir, args.experiment)
              if r.get("status") == "ok" and all(part in r["name"] for part in args.only)]
    rows = []
    for record in chosen:
        log = kept_log(record["name"], args.experiment, args.results_dir, args.work_dir)
        if log is None:
            print(f"skipped {record['name']}: no steps.csv kept or in its run folder", file=sys.stderr)
            continue
        steps, values = read_log(log, args.column)
        reached = first_step_reaching(steps, values, args.window, args.level)
        rows.append((record["name"], window_means(values, args.window), "never" if reached is None else reached))
    windows = max((len(means) for _, means, _ in rows), default=0)
    print(f"Mean {args.column} over windows of {args.window} steps; *reaches*: the first step whose mean over "
          f"the last {args.window} steps is >= {args.level}.\n")
    print("| run | " + " | ".join(f"{1 + i * args.window}–{(i + 1) * args.window}" for i in range(windows))
          + " | reaches |")
    print("|---" * (windows + 2) + "|")
    for name, means, reached in rows:
        cells = [f"{m:.2f}" for m in means] + [""] * (windows - len(means))
        print(f"| {name} | " + " | ".join(cells) + f" | {reached} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
