"""``dpnoise walls``: the seed's privacy-wall figures for gaussian, lap2 and lap2-paper."""

from __future__ import annotations

import argparse
import json

from dpnoise import checks

ACCOUNTANTS = ("gaussian", "lap2", "lap2-paper")
STYLE = {"gaussian": "C0-", "lap2": "C3-", "lap2-paper": "C3--"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "walls",
        help="draw the privacy-wall figures (seed 1 Figs. 3-4) for gaussian, lap2 and lap2-paper",
        description="Right wall: calibrated noise vs epsilon and its slope |d log noise / d log eps|. "
        "Left wall: delta(eps) at a fixed noise multiplier and the first eps where "
        "delta_gaussian > 2 delta_lap2. One row per sampling rate.",
    )
    p.add_argument("--out", required=True, help="output PNG file (its folder must exist)")
    p.add_argument("--sample-rates", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1],
                   help="sampling rates q, one figure row each (default 1e-3 1e-2 1e-1)")
    p.add_argument("--epochs", type=float, default=25.2,
                   help="epochs; steps T = ceil(epochs / q) (default 25.2 = the seed's 5860 steps at q = 0.0043)")
    p.add_argument("--params", type=float, default=26010, help="trained parameters n for Lap2 (default 26010, the seed CNN)")
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
    params = checks.check_count("--params", args.params, 1)
    fixed = checks.check_positive("--fixed-noise", args.fixed_noise)

    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpnoise.accounting import steps_from_epochs
    from dpnoise.accounting.walls import left_wall, wall_curves

    noise_grid = np.geomspace(0.3, 30.0, 24)
    eps_grid = np.geomspace(0.01, 20.0, 40)
    rows = len(args.sample_rates)
    fig, axes = plt.subplots(rows, 3, figsize=(14, 3.6 * rows), squeeze=False)
    summary = []
    for row, q in enumerate(args.sample_rates):
        steps = steps_from_epochs(args.epochs, q)
        curves = {a: wall_curves(a, q, steps, params, delta, noise_grid, eps_grid, fixed) for a in ACCOUNTANTS}
        walls = {a: left_wall(eps_grid, curves["gaussian"].delta_curve, curves[a].delta_curve) for a in ("lap2", "lap2-paper")}
        summary.append({"sample_rate": q, "steps": steps, "left_wall": walls})
        ax_n, ax_s, ax_d = axes[row]
        for a, c in curves.items():
            ax_n.loglog(c.epsilon, c.noise, STYLE[a], label=a)
            ax_s.semilogx(c.epsilon, c.right_wall_slope, STYLE[a], label=a)
            ax_d.loglog(c.delta_epsilons, np.maximum(c.delta_curve, 1e-300), STYLE[a], label=a)
        for a, w in walls.items():
            if w is not None:
                ax_d.axvline(w, color="k", ls=":" if a == "lap2" else "-.", lw=0.8, label=f"left wall ({a})")
        ax_n.set(xlabel="epsilon", ylabel="noise (sigma or b/C)", title=f"q={q:g}, T={steps}: noise for eps at delta={delta:g}")
        ax_s.set(xlabel="epsilon", ylabel="|d log noise / d log eps|", title="right wall slope W_R")
        ax_d.set(xlabel="epsilon", ylabel="delta(eps)", title=f"delta(eps) at noise {fixed:g}", ylim=(1e-12, 2))
        for ax in (ax_n, ax_s, ax_d):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Privacy walls (lap2-paper is the published accountant, NOT a valid bound in general)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(json.dumps({"out": str(out), "rows": summary}) if args.json else f"wrote {out}")
    return 0
