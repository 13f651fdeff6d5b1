"""The privacy-wall figure (the Lap2 paper's Figs. 3-4) for gaussian, lap2 and lap2-paper.

Right wall: calibrated noise vs epsilon and its slope |d log noise / d log eps|.  Left wall:
delta(eps) at a fixed noise multiplier and the first eps where delta_gaussian > 2 delta_lap2.
One row per sampling rate.  ``dpnoise walls`` and the reproduction's figures draw it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from dpnoise import checks

ACCOUNTANTS = ("gaussian", "lap2", "lap2-paper")
STYLE = {"gaussian": "C0-", "lap2": "C3-", "lap2-paper": "C3--"}
DEFAULT_SAMPLE_RATES = (1e-3, 1e-2, 1e-1)
#: the Lap2 paper's 5860 steps at q = 0.0043
DEFAULT_EPOCHS = 25.2
#: trained parameters of the paper's CNN
DEFAULT_PARAMS = 26010


def walls_figure(
    out: str | os.PathLike, *, sample_rates: Sequence[float] = DEFAULT_SAMPLE_RATES, epochs: float = DEFAULT_EPOCHS,
    params: float = DEFAULT_PARAMS, delta: float = 1e-5, fixed_noise: float = 1.0,
) -> list[dict[str, Any]]:
    """Draw the walls into the PNG file ``out`` (its folder must exist); return each row's key numbers.

    Args:
        out: output PNG file.
        sample_rates: sampling rates q, one figure row each.
        epochs: epochs; steps T = ceil(epochs / q).
        params: trained parameters n (Lap2).
        delta: delta of the noise-vs-epsilon curves.
        fixed_noise: noise multiplier (sigma, or b/C) of the delta(eps) curves.

    Returns:
        per sampling rate: ``{"sample_rate", "steps", "left_wall": {accountant: eps or None}}``.
        Invalid arguments raise :class:`~dpnoise.accounting.InvalidParameterError` naming them.
    """
    out = checks.output_file("out", out, suffixes=(".png",))
    checks.each(checks.check_sample_rate, "sample_rates", sample_rates)
    checks.check_positive("epochs", epochs)
    for q in sample_rates:
        checks.finite_steps("epochs / sample_rates", epochs, q)
    delta = checks.check_delta("delta", delta)
    params = checks.check_count("params", params, 1)
    fixed = checks.check_positive("fixed_noise", fixed_noise)

    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpnoise.accounting import steps_from_epochs
    from dpnoise.accounting.walls import left_wall, wall_curves

    noise_grid = np.geomspace(0.3, 30.0, 24)
    eps_grid = np.geomspace(0.01, 20.0, 40)
    rows = len(sample_rates)
    fig, axes = plt.subplots(rows, 3, figsize=(14, 3.6 * rows), squeeze=False)
    summary = []
    for row, q in enumerate(sample_rates):
        steps = steps_from_epochs(epochs, q)
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
    return summary
