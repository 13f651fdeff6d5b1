"""Figures of the reproduction: accuracy vs epsilon, convergence, noise needed vs epsilon, walls."""

from __future__ import annotations

import statistics
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from reproductions.plans import Column

#: Seed 1's MNIST accounting setting for the noise-vs-epsilon figure.
NOISE_FIGURE_SETTING = dict(delta=1e-5, sample_rate=0.0043, steps=5860, clip=1.0, params=26010)
NOISE_FIGURE_EPSILONS = tuple(np.geomspace(0.1, 8.0, 12))


def pyplot():
    """matplotlib.pyplot with the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def save_figure(fig, title: str, out: Path) -> Path:
    """Title, lay out, write ``out`` as PNG and free the figure."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def column_rows(rows: Sequence[dict[str, Any]], dataset: str, column: Column) -> list[dict[str, Any]]:
    """Finished aggregated rows of one column on one dataset, by increasing epsilon."""
    return sorted((r for r in rows if r["dataset"] == dataset and r["status"] == "ok"
                   and r["mechanism"] == column.mechanism and r["calibrated_with"] == column.calibrated_with),
                  key=lambda r: r["target_epsilon"])


def accuracy_vs_epsilon(rows: Sequence[dict[str, Any]], datasets: Sequence[str], columns: Sequence[Column],
                        published: dict[str, dict[float, dict[str, float]]], out: Path, title: str) -> Path:
    """One panel per dataset: our mean accuracy (error bars: std over seeds) and, dashed, the seed's."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for i, column in enumerate(columns):
            mine = column_rows(rows, dataset, column)
            if mine:
                ax.errorbar([r["target_epsilon"] for r in mine], [100 * r["accuracy_mean"] for r in mine],
                            yerr=[100 * (r["accuracy_std"] or 0.0) for r in mine], fmt="o-", color=f"C{i}",
                            capsize=3, label=f"{column.label} (ours)")
            paper = sorted((eps, values[column.calibrated_with]) for eps, values in published.get(dataset, {}).items()
                           if column.calibrated_with in values)
            if paper:
                ax.plot(*zip(*paper), "x--", color=f"C{i}", alpha=0.6, label=f"{column.label} (seed)")
        ax.set(xscale="log", xlabel="target epsilon (delta = 1e-5)", ylabel="test accuracy (%)", title=dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, title, out)


def mean_curve(records: Sequence[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """Test accuracy (percent) against step, averaged over the records (seeds) that reach each step."""
    by_step: dict[int, list[float]] = {}
    for record in records:
        for point in record["curve"]:
            by_step.setdefault(point["step"], []).append(100 * point["test_accuracy"])
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def convergence(records: Sequence[dict[str, Any]], dataset: str, columns: Sequence[Column], out: Path,
                title: str) -> Path:
    """Seed 1 Fig. 8 style: test accuracy vs step, one panel per epsilon, one line per column."""
    plt = pyplot()
    ok = [r for r in records if r["dataset"] == dataset and r["status"] == "ok"]
    epsilons = sorted({r["target_epsilon"] for r in ok}, reverse=True)
    fig, axes = plt.subplots(1, max(len(epsilons), 1), figsize=(4.2 * max(len(epsilons), 1), 3.8), squeeze=False)
    for ax, eps in zip(axes[0], epsilons):
        for i, column in enumerate(columns):
            mine = [r for r in ok if r["target_epsilon"] == eps and r["mechanism"] == column.mechanism
                    and r["calibrated_with"] == column.calibrated_with]
            if mine:
                ax.plot(*mean_curve(mine), ".-", color=f"C{i}", label=f"{column.label} (n={len(mine)})")
        ax.set(xlabel="step", ylabel="test accuracy (%)", title=f"{dataset}, target eps {eps:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, title, out)


def noise_needed(accountant: str, epsilons: Sequence[float]) -> list[float]:
    """Calibrated noise (sigma, or absolute b at C = 1) for each epsilon in NOISE_FIGURE_SETTING."""
    from dpnoise.accounting import UnsoundAccountantWarning, calibrate_noise

    s = NOISE_FIGURE_SETTING
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return [calibrate_noise(accountant, eps, s["delta"], s["sample_rate"], s["steps"], clip=s["clip"],
                                params=s["params"]).noise for eps in epsilons]


def noise_vs_epsilon(out: Path, epsilons: Sequence[float] = NOISE_FIGURE_EPSILONS) -> dict[str, list[float]]:
    """Noise needed vs epsilon for gaussian / lap2 / lap2-paper (pure accounting), as a PNG.

    Left: the noise parameter (Gaussian sigma, Laplace b). Right: the per-coordinate standard
    deviation of the noise on the summed gradient (sigma C for Gaussian, sqrt(2) b for Laplace),
    which is what training sees.  Returns the curves.
    """
    plt = pyplot()
    curves = {name: noise_needed(name, epsilons) for name in ("gaussian", "lap2", "lap2-paper")}
    std_factor = {"gaussian": 1.0, "lap2": np.sqrt(2.0), "lap2-paper": np.sqrt(2.0)}
    style = {"gaussian": "C0o-", "lap2": "C3o-", "lap2-paper": "C3x--"}
    fig, (ax_p, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, values in curves.items():
        ax_p.loglog(epsilons, values, style[name], label=name + (" (NOT a valid bound)" if name == "lap2-paper" else ""))
        ax_s.loglog(epsilons, std_factor[name] * np.asarray(values), style[name], label=name)
    ax_p.set(xlabel="target epsilon", ylabel="sigma (Gaussian) or b (Laplace)", title="noise parameter")
    ax_s.set(xlabel="target epsilon", ylabel="noise std per coordinate", title="noise standard deviation")
    for ax in (ax_p, ax_s):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    s = NOISE_FIGURE_SETTING
    fig.suptitle(f"Noise needed for (eps, delta={s['delta']:g}): q={s['sample_rate']}, T={s['steps']}, "
                 f"C={s['clip']:g}, n={s['params']} (seed 1 MNIST setting)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {"epsilons": list(map(float, epsilons)), **curves}


def alpha_grid_figure(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """Seed 2 Fig. 2 (reduced): accuracy vs learning rate (left) and vs effective lr (right) per alpha."""
    plt = pyplot()
    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax_lr, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, alpha in enumerate(sorted({r["alpha"] for r in ok})):
        mine = sorted((r for r in ok if r["alpha"] == alpha), key=lambda r: r["effective_lr"])
        acc = [100 * r["accuracy_mean"] for r in mine]
        ax_lr.plot([r["lr"] for r in mine], acc, "o-", color=f"C{i}", label=f"alpha={alpha:g}")
        ax_eff.plot([r["effective_lr"] for r in mine], acc, "o-", color=f"C{i}", label=f"alpha={alpha:g}")
    ax_lr.set(xscale="log", xlabel="learning rate gamma", ylabel="test accuracy (%)", title="vs learning rate")
    ax_eff.set(xscale="log", xlabel="effective lr gamma * kappa(0.9; r, alpha)", title="vs effective learning rate")
    for ax in (ax_lr, ax_eff):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Dirichlet mechanism at eps = 1 (r = r*(alpha)), SGD")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
