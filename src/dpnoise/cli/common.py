"""Options shared by the accounting subcommands (``account``, ``calibrate``)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Optional, Sequence

from dpnoise import checks
from dpnoise.accounting import ACCOUNTANTS, MECHANISMS, accountants_for_mechanism
from dpnoise.accounting.calibration import MAX_STEPS
from dpnoise.accounting.mechanisms import get_mechanism_spec, option_fields
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_accounted,
    check_count,
    check_delta,
    check_positive,
    check_sample_rate,
)
from dpnoise.formatting import decimals

def mechanism_choices() -> list[str]:
    """--mechanism: a registered mechanism, or an accountant name standing for its mechanism and that
    accountant (read when the parser is built: a mechanism registered before is offered)."""
    return [*MECHANISMS, *(name for name in ACCOUNTANTS if name not in MECHANISMS)]


def mechanism_help() -> str:
    """One clause per registered mechanism: its name and description."""
    return "; ".join(f"{name}: {spec.description}" for name, spec in MECHANISMS.items())


def noise_help() -> str:
    """The unit of --noise for each registered mechanism."""
    return "noise in the mechanism's unit: " + "; ".join(
        f"{name}: {spec.noise.unit}" for name, spec in MECHANISMS.items())


def accountant_names() -> list[str]:
    """Every registered accountant, the unsound ones marked."""
    return [f"{name}{'' if spec.sound else ' (NOT sound)'}" for name, spec in ACCOUNTANTS.items()]


def add_setting_options(p: argparse.ArgumentParser) -> None:
    """--mechanism, sampling, steps, delta, clip, params, the mechanisms' options, json."""
    p.add_argument("--mechanism", required=True, choices=mechanism_choices(), metavar="MECHANISM",
                   help=f"{mechanism_help()}. An accountant name (e.g. lap2-paper) stands for its "
                   "mechanism with --accountant NAME")
    p.add_argument("--accountant", choices=sorted(ACCOUNTANTS), metavar="NAME",
                   help="accountant to use instead of the mechanism's default (the smallest of its sound "
                   "routes, e.g. PLD and RDP for gaussian). One of: " + ", ".join(accountant_names()))
    p.add_argument("--clip", type=float, default=1.0,
                   help="clipping norm C (L2 for lap2/gaussian, L1 for laplace-l1); default 1. "
                   "Laplace accountants depend on noise/clip only")
    rate = p.add_mutually_exclusive_group(required=True)
    rate.add_argument("--sample-rate", type=float, help="Poisson sampling rate q in (0, 1]")
    rate.add_argument("--batch-size", type=int, help="expected batch size B (with --dataset-size: q = B/N)")
    p.add_argument("--dataset-size", type=int, help="dataset size N (with --batch-size)")
    length = p.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=float, help="number of training steps T")
    length.add_argument("--epochs", type=float, help="epochs E: T = ceil(E / q)")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    p.add_argument("--params", type=float,
                   help="number of trained parameters n (lap2 and lap2-paper only, required there; up to 1e12)")
    add_mechanism_option_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def resolve_setting(args: argparse.Namespace) -> tuple[str, str, float, int, dict[str, Any]]:
    """(mechanism, accountant, q, steps, step kwargs) from parsed options; errors name the option."""
    accountant = args.mechanism
    mechanism = ACCOUNTANTS[accountant].mechanism if accountant in ACCOUNTANTS else accountant
    if accountant not in ACCOUNTANTS:
        accountant = get_mechanism_spec(mechanism).default_accountant
    if args.accountant is not None:
        if ACCOUNTANTS[args.accountant].mechanism != mechanism:
            raise InvalidParameterError(
                f"--accountant {args.accountant} does not apply to --mechanism {mechanism}; choose from "
                + ", ".join(accountants_for_mechanism(mechanism, include_options=True))
            )
        accountant = args.accountant
    check_delta("--delta", args.delta)
    if args.sample_rate is not None:
        if args.dataset_size is not None:
            raise InvalidParameterError("--dataset-size goes with --batch-size (q = B/N); with --sample-rate it "
                                        "would be ignored: drop it")
        q = check_sample_rate("--sample-rate", args.sample_rate)
    else:
        if args.dataset_size is None:
            raise InvalidParameterError("--dataset-size is required with --batch-size")
        b = check_count("--batch-size", args.batch_size, 1)
        n = check_count("--dataset-size", args.dataset_size, 1)
        q = check_sample_rate("--batch-size / --dataset-size", b / n)
    if args.steps is not None:
        steps = checks.count_in("--steps", args.steps, 1, MAX_STEPS)
    else:
        steps = checks.finite_steps("--epochs", check_positive("--epochs", args.epochs), q)
    spec = get_mechanism_spec(mechanism)
    if args.params is not None and not spec.needs_params:  # refused rather than silently ignored
        users = ", ".join(name for name, other in MECHANISMS.items() if other.needs_params)
        raise InvalidParameterError(f"--params does not apply to mechanism {mechanism!r} (only to {users})")
    params = None
    if spec.needs_params:
        if args.params is None:
            raise InvalidParameterError(f"--params (number of trained parameters n >= 1) is required for {mechanism}")
        params = checks.params("--params", args.params)
    options = spec.make_options(naming=lambda name: option_fields()[name].flag, **mechanism_option_values(args))
    kwargs: dict[str, Any] = {"clip": check_accounted("--clip", args.clip), "params": params, "options": options}
    return mechanism, accountant, q, steps, kwargs


def list_of(kind: Any, choices: Optional[Sequence[str]]) -> Any:
    """An argparse type: comma-separated values of ``kind`` (each one of ``choices`` where given), as a tuple."""
    def parse(text: str) -> tuple:
        values = []
        for item in text.split(","):
            try:
                value = kind(item.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {item.strip()!r}") from None
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(choices)})")
            values.append(value)
        return tuple(values)
    return parse


def add_mechanism_option_flags(group: Any, lists: bool = False) -> None:
    """One flag per option field of the registered mechanisms, generated from their options dataclasses
    (:func:`~dpnoise.accounting.mechanisms.option_fields`); a flag given to a mechanism without that option is
    refused (:meth:`~dpnoise.accounting.MechanismSpec.make_options`).  ``lists``: comma-separated values."""
    for option in option_fields().values():
        group.add_argument(option.flag, dest=f"option_{option.name}",
                           type=list_of(option.type, None) if lists else option.type,
                           metavar=option.name.upper().replace("_", "-") + ("[,...]" if lists else ""),
                           help=f"{option.help} ({', '.join(option.mechanisms)} only)")


def mechanism_option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The mechanism options given on the command line, by field name."""
    given = {name: getattr(args, f"option_{name}", None) for name in option_fields()}
    return {name: value for name, value in given.items() if value is not None}


def accountant_lines(epsilon_by_accountant: dict[str, float]) -> list[str]:
    """One line per accountant when several apply (e.g. lap2 and lap2-paper side by side), each epsilon
    rounded up at its last printed decimal (never below the bound it prints)."""
    if len(epsilon_by_accountant) < 2:
        return []
    width = max(26, *(len(name) for name in epsilon_by_accountant))
    return [
        f"  {name:<{width}} epsilon = {decimals(value, 4, 'up')}  "
        f"({'sound' if ACCOUNTANTS[name].sound else 'NOT a valid bound in general'})"
        for name, value in epsilon_by_accountant.items()
    ]


def emit(payload: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    """Print ``payload`` as JSON or ``lines`` as text."""
    print(json_text(payload) if as_json else "\n".join(lines))


def json_text(payload: dict[str, Any]) -> str:
    """``payload`` as strict JSON, which any parser reads: a value that is not a finite number (an epsilon no
    route certifies) becomes null, with a ``<key>_reason`` beside it; other objects their ``str``."""
    return json.dumps(_finite(payload), allow_nan=False, default=str)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float in a dict replaced by None and its reason (lists: None alone)."""
    if isinstance(value, dict):
        finite = {}
        for key, item in value.items():
            finite[key] = _finite(item)
            if isinstance(item, float) and not math.isfinite(item):
                finite[f"{key}_reason"] = f"{item} (not a finite number: no bound could be certified)"
        return finite
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
