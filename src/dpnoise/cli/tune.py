"""``dpnoise tune``: private hyperparameter tuning whose epsilon covers the search
(:mod:`dpnoise.training.tuning`; Papernot & Steinke, arXiv 2110.03620)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dpnoise import checks
from dpnoise.cli.common import emit
from dpnoise.cli.train import add_training_options, configuration_fields
from dpnoise.formatting import decimals
from dpnoise.training.config import MECHANISM_OPTIONS, OPTIONS, option_flag_of

EXAMPLES = """examples:
  # the learning rate and the clipping norm of DP-SGD on digits, 3 trials on average, epsilon 3 in total
  dpnoise tune --dataset digits --model cnn --mechanism gaussian --epsilon 3 --delta 1e-5 --epochs 3 \\
      --batch-size 64 --lr 0.001,0.003 --clip 0.5,1 --trials-mean 3 --out runs/tuned
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="tune hyperparameters privately: the epsilon covers the whole search",
        description="Private hyperparameter tuning (Papernot & Steinke, ICLR 2022): takes dpnoise train's options, any "
        "of which may be a comma-separated list of values (the grid). A random number of trials (Poisson, or a "
        "truncated negative binomial, with the given mean; drawn from the operating system's entropy) each trains a "
        "candidate drawn at random to the per-trial epsilon, calibrated so that releasing the best trial costs at most "
        "--epsilon in total (the RDP bound of the best of a random number of runs). Only the best trial is released: "
        "its hyperparameters, its accuracy on the packaged data set's public evaluation split and, with --out, its "
        "outputs; the trials run silently, and neither their number nor the other trials are shown. --epsilon is the "
        "total budget of the search.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p, lists=True)
    tuning = p.add_argument_group("tuning")
    tuning.add_argument("--trials-mean", type=float, required=True, metavar="M",
                        help="the expected number of trials (>= 1)")
    tuning.add_argument("--trials-shape", type=float, default=math.inf, metavar="ETA",
                        help="the law of the number of trials: inf (default) Poisson; 0 logarithmic, 1 geometric, any "
                        "other >= 0 the truncated negative binomial of that shape (a smaller shape costs less epsilon "
                        "for the same mean; its tail is longer)")
    tuning.add_argument("--tuning-state", type=Path, default=None, metavar="FILE",
                        help="keep the job's progress in FILE (the secret number of trials, the trials done, the best so "
                        "far: keep it as private as the data); run the same command again after a kill and it resumes "
                        "without drawing the number of trials again or repeating a finished trial; a finished job's "
                        "FILE releases the same best trial again")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    values = configuration_fields(args)
    total = values.pop("privacy.target_epsilon", None)
    if total is None or len(total) != 1:
        raise checks.InvalidParameterError("--epsilon (the total budget of the search) takes one value")
    base, grid = {}, {}
    for path, given in values.items():
        pairs = given.items() if path == MECHANISM_OPTIONS else [(None, given)]
        for name, value in pairs:
            field = path if name is None else f"{path}.{name}"
            listed = value if isinstance(value, tuple) else (value,)
            if len(listed) > 1:
                grid[field] = list(listed)
            else:
                base[field] = listed[0]
    folder = base.pop("output.folder", None)
    from dpnoise.training.config import InvalidConfigError
    from dpnoise.training.tuning import tune_private

    try:
        result = tune_private(base, grid, total_epsilon=checks.check_positive("--epsilon", total[0]),
                              trials_mean=checks.check_positive("--trials-mean", args.trials_mean),
                              trials_shape=args.trials_shape, output_folder=folder,
                              state_file=args.tuning_state, progress=base.get("output.progress", True))
    except InvalidConfigError as err:
        raise checks.InvalidParameterError(err.named(option_flag_of)) from err
    summary = result.summary()
    lines = [f"tuning: {summary['candidates']} candidates, trials {summary['trials']['law']}: epsilon "
             f"{decimals(result.plan.total_epsilon, 4, 'up')} in total at delta {result.plan.delta:g} "
             f"(each trial {decimals(result.plan.trial_epsilon, 4, 'down')}; {result.plan.rdp_accountant})"]
    if result.best is None:
        lines.append("no trial ran (the number of trials drawn was 0): nothing is released")
    else:
        shown = ", ".join(f"{OPTIONS[path].flag if path in OPTIONS else option_flag_of(path)} {value}"
                          for path, value in result.best.items())
        lines.append(f"best: {shown}: test accuracy {result.best_score:.4f}")
        if result.best_folder is not None:
            lines.append(f"its outputs: {result.best_folder}")
    emit(summary, args.json, lines)
    return 0
