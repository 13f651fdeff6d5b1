"""``dpnoise walls``: the Lap2 paper's privacy-wall figures for gaussian, lap2 and lap2-paper
(:func:`dpnoise.plotting.walls_figure` draws them)."""

from __future__ import annotations

import argparse

from dpnoise import checks
from dpnoise.cli.common import json_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "walls",
        help="draw the privacy-wall figures (Lap2 paper Figs. 3-4) for gaussian, lap2 and lap2-paper",
        description="Right wall: calibrated noise vs epsilon and its slope |d log noise / d log eps|. "
        "Left wall: delta(eps) at a fixed noise multiplier and the first eps where "
        "delta_gaussian > 2 delta_lap2. One row per sampling rate.",
    )
    p.add_argument("--out", required=True, help="output PNG file (its folder must exist)")
    p.add_argument("--sample-rates", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1],
                   help="sampling rates q, one figure row each (default 1e-3 1e-2 1e-1)")
    p.add_argument("--epochs", type=float, default=25.2,
                   help="epochs; steps T = ceil(epochs / q) (default 25.2 = the Lap2 paper's 5860 steps at q = 0.0043)")
    p.add_argument("--params", type=float, default=26010, help="trained parameters n for Lap2 (default 26010, the tutorial CNN)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta for the noise-vs-epsilon curves (default 1e-5)")
    p.add_argument("--fixed-noise", type=float, default=1.0,
                   help="noise multiplier (sigma, or b/C) of the delta(eps) curves (default 1)")
    p.add_argument("--json", action="store_true", help="also print the curves' key numbers as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = checks.output_file("--out", args.out, suffixes=(".png",))
    checks.each(checks.check_sample_rate, "--sample-rates", args.sample_rates)
    checks.check_positive("--epochs", args.epochs)
    for q in args.sample_rates:
        checks.finite_steps("--epochs / --sample-rates", args.epochs, q)
    delta = checks.check_delta("--delta", args.delta)
    params = checks.params("--params", args.params)
    fixed = checks.check_positive("--fixed-noise", args.fixed_noise)

    from dpnoise.plotting import walls_figure

    summary = walls_figure(out, sample_rates=args.sample_rates, epochs=args.epochs, params=params, delta=delta,
                           fixed_noise=fixed)
    print(json_text({"out": str(out), "rows": summary}) if args.json else f"wrote {out}")
    return 0
