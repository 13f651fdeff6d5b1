"""Checks of the reproduction runner itself, and tools that read finished runs (see reproductions/README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reproductions.cli import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR
from reproductions.records import load_records


def add_finished_run_options(parser: argparse.ArgumentParser) -> None:
    """The options that choose finished runs: ``--experiment``, ``--only``, ``--results-dir``, ``--work-dir``."""
    parser.add_argument("--experiment", required=True, help="the experiment whose finished runs are read")
    parser.add_argument("--only", nargs="+", default=[],
                        help="only the records whose name contains each of these strings, e.g. T300 seed0")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR,
                        help="the records (this tool's output is written beside them)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                        help="the runs' folders (checkpoints and per-step logs)")


def finished_records(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The records of ``args.experiment`` that finished and whose name contains every ``args.only`` string."""
    return [r for r in load_records(args.results_dir, args.experiment)
            if r.get("status") == "ok" and all(part in r["name"] for part in args.only)]
