"""``python -m reproductions``: run the papers' experiments and draw their tables and figures.

Records go to ``reproductions/results/`` and tables/figures to ``reproductions/reports/`` of this
checkout (not of the working directory) unless other folders are given.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from dpnoise import checks
from dpnoise.errors import DpnoiseError

if TYPE_CHECKING:
    from reproductions.records import RunSpec

#: This folder: the default home of records, reports and per-run work folders.
HERE = Path(__file__).resolve().parent
DEFAULT_RESULTS_DIR = HERE / "results"
DEFAULT_REPORTS_DIR = HERE / "reports"
DEFAULT_WORK_DIR = HERE / "results" / "logs" / "runs"
DEFAULT_SEEDS = (0, 1, 2)
#: Choices and defaults kept here so that building the parser imports no torch (the runner loads
#: the datasets); a test checks them against
#: reproductions.plans.EXPERIMENTS and reproductions.runner.DEFAULT_THREADS.
EXPERIMENT_CHOICES = ("table2", "finetune", "finetune-full", "dirichlet", "scatternet", "clipping", "figures")
DEFAULT_THREADS = 1
#: dpnoise.models.TRAINABLE_PARTS (a test checks them)
TRAINABLE_CHOICES = ("last-block", "all", "no-embeddings", "lora", "head")
EXAMPLES = """examples:
  # Lap2 paper's Table II on Fashion-MNIST, one seed, two epsilons (T = 5860 steps per run)
  python -m reproductions --experiment table2 --dataset fashion-mnist --quick
  # the full table: both datasets, 5 epsilons, seeds 0 1 2, every column
  python -m reproductions --experiment table2
  # Dirichlet-mechanism paper: Dirichlet vs DP-SGD vs penultimate Gaussian, and the alpha grid
  python -m reproductions --experiment dirichlet --dataset mnist --seeds 0
  # Tramer & Boneh's ScatterNet recipe for every mechanism (MNIST, Fashion-MNIST, CIFAR-10)
  python -m reproductions --experiment scatternet --dataset fashion-mnist --seeds 0
  # the Lap2 paper's Table III at full dimension (MiniLM-L6, 22.7M parameters trained), seed 0, two epsilons
  python -m reproductions --experiment finetune-full --dataset sst2 --seeds 0 --epsilons 3.74 0.54 --jobs 2
  # and its Table II ViT column at full dimension (EfficientNet-Lite0, 3.38M parameters trained), seed 0
  python -m reproductions --experiment finetune-full --dataset cifar10-jpeg --seeds 0 --jobs 2
  # automatic and adaptive clipping instead of flat (Gaussian and Lap2): Table II's CNN on Fashion-MNIST at
  # epsilon 0.88, and MiniLM-L6 fully fine-tuned on SST-2 at epsilon 3.74 (T = 300)
  python -m reproductions --experiment clipping --jobs 2
  python -m reproductions --experiment clipping --dataset sst2 --seeds 0 1 2
  # redraw every table and figure from the records (no training)
  python -m reproductions --experiment figures
Records: <results>/<experiment>/<run>.json, one per finished run (existing ones are skipped, so a
killed batch resumes); each states the exact `dpnoise train` command, the steps and the git commit.
"""


def build_parser() -> argparse.ArgumentParser:
    p = checks.OneLineErrorParser(
        prog="python -m reproductions",
        description="Run the papers' experiments, each run a `dpnoise train` invocation (--jobs of them "
        "at a time), writing one JSON record per finished run into --results-dir, then regenerate that "
        "experiment's aggregate "
        "(mean/std over seeds), markdown table and figures in --figures-dir. 'figures' only redraws "
        "everything from existing records, plus the accounting figures (privacy walls, noise vs eps).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--experiment", required=True, choices=EXPERIMENT_CHOICES)
    p.add_argument("--dataset", nargs="+",
                   help="datasets (default: table2 fashion-mnist mnist; dirichlet mnist fashion-mnist cifar10-jpeg; "
                   "finetune cifar10-jpeg sst2; finetune-full sst2 cifar10-jpeg; scatternet fashion-mnist mnist cifar10-jpeg; "
                   "clipping fashion-mnist, or sst2)")
    p.add_argument("--quick", action="store_true", help="one seed and two epsilons per table")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2; --quick: 0)")
    p.add_argument("--epsilons", type=float, nargs="+", help="target epsilons (default: the experiment's)")
    p.add_argument("--columns", nargs="+",
                   help="only these columns, named by their calibrating accountant (table2: gaussian "
                   "laplace-l1 lap2-paper lap2; finetune-full: gaussian lap2 lap2-paper laplace-l1; dirichlet: "
                   "dirichlet gaussian penultimate-gaussian; scatternet: gaussian lap2 laplace-l1 dirichlet)")
    p.add_argument("--models", nargs="+", help="only the runs of these models (default: every model the experiment "
                   "trains), e.g. scatternet-linear")
    p.add_argument("--steps", type=int,
                   help="override the planned steps T of every run (the records state it; default: the "
                   "experiment's, e.g. 5860 for table2)")
    p.add_argument("--ema-decay", type=float,
                   help="evaluate an exponential moving average of the parameters with this decay in (0, 1) in every "
                   "run (a variant of the experiment: its records are named ..._ema<decay>_...; default: none)")
    p.add_argument("--feature-statistics-noise", type=float, metavar="SIGMA",
                   help="scatternet models: standardise the features with per-channel statistics released with "
                   "Gaussian noise of multiplier SIGMA, in every run (a variant: records named ..._fstat<SIGMA>_...; "
                   "the release is in every epsilon; default: GroupNorm)")
    p.add_argument("--trainable", choices=TRAINABLE_CHOICES,
                   help="finetune-full only: fine-tune these parameters of MiniLM-L6 instead of all of them, in every "
                   "run (a variant at the same settings: records named ..._train-<part>_...; e.g. head: the pooler and "
                   "the classifier, 148,610 parameters)")
    p.add_argument("--study", choices=("comparison", "alpha-grid", "both"), default="both",
                   help="dirichlet only: the mechanism comparison, the alpha x effective-lr grid, or both")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR,
                   help="records (default: reproductions/results/ of this checkout)")
    p.add_argument("--figures-dir", type=Path, default=DEFAULT_REPORTS_DIR,
                   help="tables/figures (default: reproductions/reports/ of this checkout)")
    p.add_argument("--page", type=Path,
                   help="a markdown page, or a folder of them (docs/results: one page per experiment), whose "
                   "<!-- generated:NAME --> blocks are refreshed with the generated NAME.md tables (default: none)")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                   help="per-run training outputs and checkpoints (default: reproductions/results/logs/runs/, "
                   "git-ignored)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch threads per run (default 1)")
    p.add_argument("--jobs", type=int,
                   help="runs trained at the same time, each in its own process (default: the usable CPU "
                   f"cores divided by --threads, at least 1; {usable_cores()} here with one thread)")
    p.add_argument("--dry-run", action="store_true", help="list the runs (and whether they are done), train nothing")
    return p


def usable_cores() -> int:
    """CPU cores this process may run on (as :func:`reproductions.runner.usable_cores`)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose(given: Optional[Sequence], default: Sequence, quick: bool = False) -> list:
    """``given`` if set, else ``default`` (under ``quick``: its first and last items)."""
    if given:
        return list(given)
    return [default[0], default[-1]] if quick and len(default) > 1 else list(default)


def planned_specs(args: argparse.Namespace) -> list[RunSpec]:
    """The runs of ``args.experiment`` in execution order."""
    from reproductions import plans

    quick = args.quick
    seeds = args.seeds or (DEFAULT_SEEDS[:1] if quick else DEFAULT_SEEDS)
    if args.experiment == "table2":
        specs = plans.table2_specs(choose(args.dataset, plans.TABLE2_DATASETS),
                                   choose(args.epsilons, plans.TABLE2_EPSILONS, quick), seeds, args.steps)
    elif args.experiment == "dirichlet":
        datasets = choose(args.dataset, plans.DIRICHLET_DATASETS)
        specs = []
        if args.study in ("comparison", "both"):
            specs += plans.dirichlet_specs(datasets, choose(args.epsilons, plans.DIRICHLET_EPSILONS, quick),
                                           seeds, args.steps)
        if args.study in ("alpha-grid", "both"):
            specs += plans.alpha_grid_specs(datasets[0], seeds, args.steps)
    elif args.experiment == "scatternet":
        specs = plans.scatternet_specs(choose(args.dataset, plans.SCATTERNET_DATASETS),
                                       choose(args.epsilons, plans.SCATTERNET_EPSILONS, quick), seeds, args.steps)
    elif args.experiment == "clipping":
        specs = plans.clipping_specs(choose(args.dataset, plans.CLIPPING_DATASETS), args.epsilons, seeds, args.steps)
    elif args.experiment == "finetune-full":
        specs = plans.finetune_full_specs(choose(args.dataset, tuple(plans.FINETUNE_FULL_TASKS)), args.epsilons,
                                          seeds, args.steps, quick)
    else:
        specs = plans.finetune_specs(choose(args.dataset, tuple(plans.FINETUNE_TASKS)), args.epsilons, seeds,
                                     args.steps, quick)
    if args.ema_decay is not None:
        specs = [replace(spec, ema_decay=args.ema_decay) for spec in specs]
    if args.trainable is not None:
        specs = [replace(spec, trainable=args.trainable) for spec in specs]
    if args.feature_statistics_noise is not None:
        specs = [replace(spec, feature_statistics_noise=args.feature_statistics_noise) for spec in specs]
    specs = only(specs, "calibrated_with", args.columns, "--columns", f"a column of {args.experiment}")
    return only(specs, "model", args.models, "--models", "a model of these runs")


def only(specs: list[RunSpec], field: str, chosen: Optional[list[str]], flag: str, what: str) -> list[RunSpec]:
    """The specs whose ``field`` is one of ``chosen`` (all of them when nothing is chosen); a choice that no
    spec has is refused, naming ``flag`` and the choices."""
    if not chosen:
        return specs
    offered = sorted({getattr(s, field) for s in specs})
    unknown = [c for c in chosen if c not in offered]
    if unknown:
        raise checks.InvalidParameterError(f"{flag} {' '.join(unknown)}: not {what}; choose from {' '.join(offered)}")
    return [s for s in specs if getattr(s, field) in chosen]


def check_options(args: argparse.Namespace) -> None:
    """Check every option before anything is planned, trained or written; errors name the flag."""
    checks.each(checks.seed, "--seeds", args.seeds)
    checks.each(checks.check_positive, "--epsilons", args.epsilons)
    checks.optional(checks.check_count, "--steps", args.steps, 1)
    checks.optional(checks.open_fraction, "--ema-decay", args.ema_decay)
    if args.trainable is not None and args.experiment != "finetune-full":
        raise checks.InvalidParameterError(f"--trainable applies to --experiment finetune-full only, not {args.experiment}")
    checks.optional(checks.check_positive, "--feature-statistics-noise", args.feature_statistics_noise)
    checks.check_count("--threads", args.threads, 1)
    checks.optional(checks.check_count, "--jobs", args.jobs, 1)
    if args.dataset and args.experiment != "figures":
        from dpnoise.data import DATASETS
        from reproductions import plans

        # table2, dirichlet and scatternet train image models
        offered = {"finetune": tuple(plans.FINETUNE_TASKS), "finetune-full": tuple(plans.FINETUNE_FULL_TASKS),
                   "clipping": tuple(plans.CLIPPING_TASKS)}.get(
            args.experiment, tuple(d for d in sorted(DATASETS) if d != "sst2"))
        for dataset in args.dataset:
            if dataset not in offered:
                raise checks.InvalidParameterError(
                    f"--dataset {dataset}: not a dataset of {args.experiment}; choose from {' '.join(offered)}")
    if args.dry_run:
        return  # nothing is written
    checks.output_folder("--figures-dir", args.figures_dir)
    if args.experiment != "figures":
        checks.output_folder("--results-dir", args.results_dir)
        checks.output_folder("--work-dir", args.work_dir)
    if args.page:
        if args.page.is_dir():
            checks.output_folder("--page", args.page)
        else:
            checks.output_file("--page", args.page)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    from reproductions import reports
    from reproductions.runner import default_jobs, run_specs

    # force: an imported library may already have put a WARNING-level handler on the root logger
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    if args.experiment == "figures" and args.dry_run:
        print(f"figures: nothing to train; would redraw every table and figure from {args.results_dir} "
              f"into {args.figures_dir}")
        return 0
    if args.experiment == "figures":
        args.figures_dir.mkdir(parents=True, exist_ok=True)
        written = reports.write_aggregates(args.results_dir) if args.results_dir.exists() else []
        written += reports.accounting_figures(args.figures_dir)
        for report in reports.REPORTS.values():
            written += report(args.results_dir, args.figures_dir)
        return finish(args, written)
    specs = planned_specs(args)
    if args.dry_run:
        from reproductions.records import record_path

        for spec in specs:
            print(f"{'done' if record_path(args.results_dir, spec).exists() else 'todo'}  {spec.name}")
        return 0
    args.figures_dir.mkdir(parents=True, exist_ok=True)
    run_specs(specs, args.results_dir, args.work_dir, threads=args.threads,
              jobs=args.jobs or default_jobs(args.threads))
    written = reports.write_aggregates(args.results_dir) + reports.REPORTS[args.experiment](args.results_dir,
                                                                                            args.figures_dir)
    return finish(args, written)


def finish(args: argparse.Namespace, written: list[Path]) -> int:
    """Report what was written, and refresh the generated tables on the results pages."""
    from reproductions import reports

    print("wrote " + ", ".join(map(str, written)))
    if args.page and args.page.exists():
        spliced = reports.splice_into_pages(args.page, written)
        for page, stems in spliced.items():
            print(f"updated {page}: " + ", ".join(stems))
        if not spliced:
            print(f"{args.page}: no generated blocks")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` and run; a :class:`~dpnoise.errors.DpnoiseError` is one line and status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.formatwarning = lambda message, *_: f"WARNING: {message}\n"
    try:
        return run(args)
    except DpnoiseError as err:
        print(f"{parser.prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
