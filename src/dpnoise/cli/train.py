"""``dpnoise train``: train a model privately on a packaged dataset and report accuracy and epsilon.

The options are the fields of :class:`~dpnoise.training.TrainingConfig`, generated from their declarations
(:data:`dpnoise.training.config.OPTIONS`: flag, help, check, choices), plus ``--recipe`` and ``--json``; they
become the configuration of :func:`~dpnoise.training.train_private`.  Every option is checked first, without
torch (finite, in range, paths usable); the library's errors name its configuration fields, which are printed
as their flags.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING

from dpnoise import checks
from dpnoise.accounting import MECHANISMS
from dpnoise.cli.common import (
    accountant_names,
    add_mechanism_option_flags,
    list_of,
    json_text,
    mechanism_help,
    mechanism_option_values,
    noise_help,
)
from dpnoise.training.config import MECHANISM_OPTIONS, OPTIONS, option_flag_of
from dpnoise.training.options import OPTION_GROUPS, PRIVACY, Option
from dpnoise.training.recipes import RECIPES, apply_recipe

EXAMPLES = """examples:
  # the demo: Lap2 on Fashion-MNIST, seed CNN, epsilon 1 (both Lap2 epsilons are printed)
  dpnoise train --dataset fashion-mnist --model cnn --mechanism lap2 --epsilon 1 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --clip 1 --lr 1e-3 --out runs/lap2
  # a fixed noise instead of a target: b = 1.5 (absolute Laplace scale), no budget enforcement
  dpnoise train --dataset digits --model cnn --mechanism lap2 --noise 1.5 --delta 1e-5 \\
      --epochs 5 --batch-size 64
  # Dirichlet mechanism, SGD with the learning rate from the Dirichlet-mechanism paper's effective-learning-rate heuristic
  dpnoise train --dataset mnist --model cnn --mechanism dirichlet --epsilon 4 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --alpha 1 --optimizer sgd --effective-lr 0.1 --json
  # Tramer & Boneh's recipe (ScatterNet + linear, SGD momentum 0.9, clip 0.1, batch 8192, lr 16, 40 epochs,
  # epsilon 3 at delta 1e-5) for lap2, in physical batches of 2048; any option overrides the recipe
  dpnoise train --recipe scatternet --dataset fashion-mnist --mechanism lap2 --out runs/scatternet
  # two processes on one machine (docs/DISTRIBUTED.md): each samples half of the data at the same rate
  torchrun --nproc-per-node 2 -m dpnoise train --dataset digits --mechanism lap2 --epsilon 2 --delta 1e-5 \
      --epochs 5 --batch-size 64 --threads 1
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help=f"train a model privately ({', '.join(MECHANISMS)})",
        description="Train a model with differential privacy on a packaged dataset (no downloads). Shows a progress "
        "bar (epsilon so far), then prints the test accuracy and the epsilon under every "
        "accountant that applies (for lap2: the sound 'lap2' accountant and the Lap2 paper's published 'lap2-paper' one, "
        "which is NOT a valid bound in general). Batches are Poisson-sampled; the accountants are stepped once per "
        "optimizer step. Nothing computed from a private batch without noise (its loss, accuracy or size) is shown or "
        "written unless --log-private-batch-stats.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p)
    p.set_defaults(func=run)


def add_training_options(p: argparse.ArgumentParser, lists: bool = False) -> None:
    """The configuration's flags, ``--recipe`` and ``--json``, under their headings; with ``lists`` every value
    flag takes a comma-separated list of values (``dpnoise tune``'s grid)."""
    groups = {heading: p.add_argument_group(heading) for heading in OPTION_GROUPS}
    groups[OPTION_GROUPS[0]].add_argument(
        "--recipe", choices=tuple(RECIPES), help="published hyper-parameters as defaults for the options below; "
        "options given explicitly win. scatternet: Tramer & Boneh 2021 (arXiv 2011.11660) for mnist, fashion-mnist "
        "and cifar10-jpeg with scatternet-linear (default) or scatternet-cnn: SGD momentum 0.9, clip 0.1, their batch "
        "size, lr and epochs, physical batches of 2048, epsilon 3 at delta 1e-5 (dpnoise.training.recipes)")
    registry_help = {name: text() for name, text in REGISTRY_HELP.items()}
    for heading, group in groups.items():  # group by group: the usage line lists them in the same order
        for declared in OPTIONS.values():
            if declared.group == heading:
                add_option(group, declared, registry_help, lists)
        if heading == PRIVACY:
            add_mechanism_option_flags(group, lists)
    groups[OPTION_GROUPS[-1]].add_argument("--json", action="store_true", help="print one JSON object instead of text")


#: what the help of a field may name, filled in from the registries (:class:`~dpnoise.training.options.Option`)
REGISTRY_HELP = {"mechanisms": mechanism_help, "noise_units": noise_help,
                 "accountants": lambda: ", ".join(accountant_names())}


def add_option(group: argparse._ArgumentGroup, declared: Option, registry_help: dict[str, str],
               lists: bool = False) -> None:
    """The flag of a configuration field: a switch for a bool (``--no-...`` turns a default True off), else a
    value of the field's type (with ``lists``: a comma-separated list of them) whose default None means "not
    given" (the configuration's default applies)."""
    help_text = declared.help.format(**registry_help)
    if declared.type is bool:
        group.add_argument(declared.flag, action="store_false" if declared.default else "store_true", help=help_text)
    elif lists:
        group.add_argument(declared.flag, type=list_of(declared.type, declared.allowed()), required=declared.required,
                           metavar=declared.metavar or declared.flag[2:].upper().replace("-", "_") + "[,...]",
                           help=help_text)
    else:
        group.add_argument(declared.flag, type=declared.type, choices=declared.allowed(), required=declared.required,
                           metavar=declared.metavar, help=help_text)


def option(args: argparse.Namespace, flag: str):  # the value of --flag-name (of --no-progress: the progress)
    return getattr(args, flag[2:].replace("-", "_"))


def configuration_fields(args: argparse.Namespace) -> dict:
    """The configuration's fields from the options given (and the ``--recipe``'s for the others)."""
    values = {path: option(args, declared.flag) for path, declared in OPTIONS.items()}
    values[MECHANISM_OPTIONS] = mechanism_option_values(args) or None
    if args.recipe:
        values = apply_recipe(values, args.recipe)
    for path, declared in OPTIONS.items():  # the fields without a default that the command line does not require
        if values.get(path) is None and declared.default is MISSING:
            raise checks.InvalidParameterError(f"give {declared.flag} (or a --recipe that sets it)")
    return {field: value for field, value in values.items() if value is not None}  # the others keep their defaults


def run(args: argparse.Namespace) -> int:
    """Entry point (a :class:`~dpnoise.errors.DpnoiseError` becomes one line and exit status 2 in ``main``).

    The configuration checks every field and every rule across fields (:data:`~dpnoise.training.config.RULES`)
    before torch is imported; its messages name the flags."""
    values = configuration_fields(args)
    from dpnoise.training.config import InvalidConfigError, TrainingConfig

    try:
        config = TrainingConfig.from_fields(values)
        from dpnoise.training import train_private
        from dpnoise.training.summary import report_lines

        result = train_private(config)
    except InvalidConfigError as err:  # the configuration's field names become the flags
        raise checks.InvalidParameterError(err.named(option_flag_of)) from err
    if result.rank == 0:  # under torchrun, one report
        print(json_text(result.summary()) if args.json else "\n".join(report_lines(result.summary())))
    return 0
