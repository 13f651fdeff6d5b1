"""How well a re-run reproduces the committed records: test accuracy of the same run, twice.

A run is named by its full configuration including the seed, which fixes the initialisation, the
Poisson batches and the noise draws; what can still differ between two runs of one name is the
floating-point arithmetic (another host's kernels, another commit's memory layout), and training
can amplify such differences.  Prints, per experiment, a markdown row with the number of runs found
in both folders, how many reached exactly the same accuracy, and the median and largest absolute
difference in points, then every run that differs by more than --show-above points.

    .venv/bin/python -m reproductions.tools.compare_reruns --reruns reproductions/results/reruns/2026-11-30-quick
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from reproductions.cli import DEFAULT_RESULTS_DIR
from reproductions.records import load_records

EXPERIMENTS = ("table2", "finetune", "finetune-full", "dirichlet", "dirichlet-alpha")


def accuracy_by_name(results_dir: Path, experiment: str) -> dict[str, float]:
    """Test accuracy (percent) of every finished run of ``experiment`` under ``results_dir``."""
    return {r["name"]: 100 * r["accuracy"] for r in load_records(results_dir, experiment)
            if r.get("accuracy") is not None}


def compare(records: dict[str, float], reruns: dict[str, float]) -> list[tuple[str, float, float]]:
    """(name, recorded %, re-run %) for every run present in both."""
    return [(name, records[name], reruns[name]) for name in sorted(reruns) if name in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=DEFAULT_RESULTS_DIR,
                        help="committed records (default reproductions/results/)")
    parser.add_argument("--reruns", type=Path, required=True, help="results folder of the re-run")
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), help="experiments to compare")
    parser.add_argument("--show-above", type=float, default=1.0, help="list runs differing by more points")
    args = parser.parse_args()

    print("| experiment | runs | identical | median abs. difference (points) | largest |")
    print("|---|---|---|---|---|")
    outliers = []
    for experiment in args.experiments:
        pairs = compare(accuracy_by_name(args.records, experiment), accuracy_by_name(args.reruns, experiment))
        if not pairs:
            continue
        differences = [abs(rerun - recorded) for _, recorded, rerun in pairs]
        identical = sum(rerun == recorded for _, recorded, rerun in pairs)
        print(f"| {experiment} | {len(pairs)} | {identical} | {statistics.median(differences):.2f} "
              f"| {max(differences):.2f} |")
        outliers += [(experiment, *pair) for pair in pairs if abs(pair[2] - pair[1]) > args.show_above]
    if outliers:
        print(f"\nRuns differing by more than {args.show_above} points (recorded -> re-run):")
        for experiment, name, recorded, rerun in outliers:
            print(f"* {experiment}/{name}: {recorded:.2f} -> {rerun:.2f}")


if __name__ == "__main__":
    main()
