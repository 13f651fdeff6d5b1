"""``dpnoise calibrate``: the noise (and Lap2 clip) that reaches a target epsilon."""

from __future__ import annotations

import argparse
import dataclasses

from dpnoise.accounting import ACCOUNTANTS, calibrate, get_mechanism_spec
from dpnoise.accounting.validation import check_positive
from dpnoise.cli.common import accountant_lines, add_setting_options, emit, resolve_setting
from dpnoise.formatting import decimals, significant_digits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="find the smallest noise (largest Dirichlet r) reaching a target epsilon",
        description="Calibrate the noise to a target (epsilon, delta); the result never overshoots "
        "the target. Lap2 runs the Lap2 paper's Algorithm 1 (b for the given C, with the epsilon "
        "under every Lap2 accountant); dirichlet finds r* by Brent's method and reports an "
        "unreachable floor.",
    )
    p.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0")
    add_setting_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mechanism, accountant, q, steps, kwargs = resolve_setting(args)
    target = check_positive("--epsilon", args.epsilon)
    mechanism_spec = get_mechanism_spec(mechanism)
    result = calibrate(accountant, target, args.delta, q, steps, **kwargs)
    spec = ACCOUNTANTS[accountant]
    payload = {**dataclasses.asdict(result), **result.options.to_dict(), "sound": spec.sound, "warning": spec.warning,
               "scope": spec.scope, result.noise_keyword: result.noise}
    del payload["options"]  # its fields are given one by one, as by ``dpnoise account``
    noise = mechanism_spec.noise.printed(result.noise)  # rounded toward privacy (the JSON keeps every digit)
    options = "".join(f"{name} = {value:g}, " for name, value in result.options.to_dict().items() if value is not None)
    lines = [f"{accountant}: {result.noise_keyword} = {noise} ({mechanism_spec.noise.unit}) "
             f"with {options}clip C = {significant_digits(result.clip, 6, 'down')}, "
             f"epsilon = {decimals(result.epsilon, 4, 'up')}"]
    lines[0] += f" at delta = {result.delta:g} ({steps} steps at q = {q:.6g})"
    lines += accountant_lines(result.epsilon_by_accountant)
    if spec.scope:
        lines.append(spec.scope)
    emit(payload, args.json, lines)
    return 0
