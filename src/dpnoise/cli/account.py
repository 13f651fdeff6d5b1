"""``dpnoise account``: epsilon of a training run from its noise, sampling and length."""

from __future__ import annotations

import argparse

from dpnoise.accounting import (
    ACCOUNTANTS,
    accountants_for_mechanism,
    epsilon_after,
    get_accountant,
    get_mechanism_spec,
)
from dpnoise.cli.common import accountant_lines, add_setting_options, emit, noise_help, resolve_setting
from dpnoise.formatting import decimals


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "account",
        help="compute epsilon(delta) for given noise, sampling rate and number of steps",
        description="Compute epsilon(delta) of a Poisson-sampled training run. For lap2 and "
        "lap2-paper both Lap2 accountants are shown side by side (epsilon_by_accountant).",
    )
    p.add_argument("--noise", type=float, required=True, help=noise_help())
    add_setting_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mechanism, accountant, q, steps, kwargs = resolve_setting(args)
    get_mechanism_spec(mechanism).check_noise(args.noise, kwargs["clip"], noise_name="--noise", clip_name="--clip")
    setting = {"sample_rate": q, **kwargs, "noise": args.noise}
    acc = get_accountant(accountant).step(steps=steps, **setting)
    epsilon, bound = acc.get_epsilon_and_bound(args.delta)
    by_acc = {name: epsilon_after(name, steps=steps, delta=args.delta, **setting)
              for name in accountants_for_mechanism(mechanism)}
    spec = ACCOUNTANTS[accountant]
    payload = {
        "mechanism": mechanism,
        "accountant": accountant,
        "epsilon": epsilon,
        "delta": args.delta,
        "bound": bound,
        "steps": steps,
        "sample_rate": q,
        "noise": args.noise,
        "clip": kwargs["clip"],
        "params": kwargs["params"],
        **kwargs["options"].to_dict(),
        "sound": spec.sound,
        "description": spec.description,
        "epsilon_by_accountant": by_acc,
        "sound_by_accountant": {name: ACCOUNTANTS[name].sound for name in by_acc},
        "warning": spec.warning,
        "scope": spec.scope,
    }
    lines = [
        f"mechanism {mechanism}, accountant {accountant}: epsilon = {decimals(epsilon, 4, 'up')} "
        f"at delta = {args.delta:g} "
        f"({bound}; {steps} steps at q = {q:.6g})"
    ]
    lines += accountant_lines(by_acc)
    if spec.scope:
        lines.append(spec.scope)
    emit(payload, args.json, lines)
    return 0
