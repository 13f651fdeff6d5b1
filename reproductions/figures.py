"""Figures of the reproduction: accuracy vs epsilon, convergence, noise needed vs epsilon, walls.

Every figure uses constrained layout, one legend below the panels (so no curve hides behind it),
and log axes labelled only at chosen ticks (:func:`log_scale`): matplotlib otherwise labels the
minor ticks of an axis spanning less than a decade, and those labels overlap.
"""

from __future__ import annotations

import math
import statistics
import textwrap
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from reproductions.plans import Column

#: The Lap2 paper's MNIST accounting setting (its Table I) for the noise-vs-epsilon figure.
NOISE_FIGURE_SETTING = dict(delta=1e-5, sample_rate=0.0043, steps=5860, clip=1.0, params=26010)
NOISE_FIGURE_EPSILONS = tuple(np.geomspace(0.1, 8.0, 12))


def pyplot():
    """matplotlib.pyplot with the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def panels(count: int, width: float, height: float, max_columns: int = 3):
    """A figure with ``count`` panels, at most ``max_columns`` per row (unused panels hidden),
    laid out by constrained layout; returns the figure and the list of the ``count`` axes."""
    plt = pyplot()
    count = max(count, 1)
    columns = min(count, max_columns)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False,
                             layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def nice_log_ticks(low: float, high: float) -> list[float]:
    """The values 1, 2 and 5 times a power of ten within [low, high] (if there is none: the geometric
    midpoint to two digits, so that the axis has one label)."""
    ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
             for m in (1, 2, 5)]
    inside = [t for t in ticks if low <= t * (1 + 1e-9) and t <= high * (1 + 1e-9)]
    return inside or [float(f"{math.sqrt(low * high):.2g}")]


def log_scale(ax, which: str = "x", ticks: Optional[Sequence[float]] = None) -> None:
    """Put ``ax``'s x (or y) axis on a log scale, labelled in plain numbers only at ``ticks`` (e.g.
    the epsilons that were run) or, by default, at the 1-2-5 values inside the current limits; the
    minor ticks stay unlabelled.  Call after plotting (the default ticks depend on the limits)."""
    from matplotlib import ticker

    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    if ticks is None:
        ticks = nice_log_ticks(*sorted(getattr(ax, f"get_{which}lim")()))
    axis.set_major_locator(ticker.FixedLocator(sorted(set(ticks))))
    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_minor_formatter(ticker.NullFormatter())


def shared_legend(fig, axes, columns: int = 3) -> None:
    """One legend below all panels, each label once (in first-seen order)."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside lower center",
                   ncol=min(columns, len(entries)), fontsize=8, frameon=False)


#: characters of a figure title per inch of figure width (suptitle's default "large" font: about 11
#: fit; one less leaves a margin)
TITLE_CHARACTERS_PER_INCH = 10


def wrap_title(title: str, width_inches: float) -> str:
    """``title`` broken at spaces into lines that fit a figure ``width_inches`` wide: a suptitle is
    centred and not wrapped by matplotlib's layout, so a long one is cut off at both edges."""
    return textwrap.fill(title, width=max(20, int(width_inches * TITLE_CHARACTERS_PER_INCH)))


def save_figure(fig, title: str, out: Path) -> Path:
    """Title, write ``out`` as PNG and free the figure (the layout is the figure's own, constrained)."""
    fig.suptitle(wrap_title(title, fig.get_figwidth()))
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def column_rows(rows: Sequence[dict[str, Any]], dataset: str, column: Column) -> list[dict[str, Any]]:
    """Finished aggregated rows of one column on one dataset, by increasing epsilon."""
    return sorted((r for r in rows if r["dataset"] == dataset and r["status"] == "ok"
                   and r["mechanism"] == column.mechanism and r["calibrated_with"] == column.calibrated_with),
                  key=lambda r: r["target_epsilon"])


def evaluation_split(rows: Sequence[dict[str, Any]], dataset: str) -> str:
    """The split ``dataset``'s rows were evaluated on (runs without ``eval_split`` are on test), e.g. "dev"."""
    return "/".join(sorted({r.get("eval_split") or "test" for r in rows if r["dataset"] == dataset})) or "test"


def accuracy_vs_epsilon(rows: Sequence[dict[str, Any]], datasets: Sequence[str], columns: Sequence[Column],
                        published: dict[str, dict[float, dict[str, float]]], out: Path, title: str,
                        references: Optional[dict[str, tuple[str, float]]] = None) -> Path:
    """One panel per dataset: our mean accuracy (error bars: std over seeds) and, dashed, the paper's;
    ``references[dataset] = (label, accuracy in percent)`` adds a horizontal dashed line to a panel."""
    fig, axes = panels(len(datasets), 5.6, 4.0)
    for ax, dataset in zip(axes, datasets):
        epsilons = set()
        for i, column in enumerate(columns):
            mine = column_rows(rows, dataset, column)
            if mine:
                ax.errorbar([r["target_epsilon"] for r in mine], [100 * r["accuracy_mean"] for r in mine],
                            yerr=[100 * (r["accuracy_std"] or 0.0) for r in mine], fmt="o-", color=f"C{i}",
                            capsize=3, label=f"{column.label} (ours)")
                epsilons.update(r["target_epsilon"] for r in mine)
            paper = sorted((eps, values[column.calibrated_with]) for eps, values in published.get(dataset, {}).items()
                           if column.calibrated_with in values)
            if paper:
                ax.plot(*zip(*paper), "x--", color=f"C{i}", alpha=0.6, label=f"{column.label} (paper)")
                epsilons.update(eps for eps, _ in paper)
        if dataset in (references or {}):
            label, accuracy = references[dataset]
            ax.axhline(accuracy, color="0.3", linestyle="--", alpha=0.7, label=label)
        ax.set(xlabel="target epsilon (delta = 1e-5)", ylabel=f"{evaluation_split(rows, dataset)} accuracy (%)",
               title=dataset)
        log_scale(ax, "x", sorted(epsilons) or None)
        ax.grid(alpha=0.3)
    shared_legend(fig, axes, columns=min(3, 2 * len(datasets)))  # one narrow panel fits two columns
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
    """The Lap2 paper's Fig. 8 style: test accuracy vs step, one panel per epsilon, one line per column
    (the mean over the seeds run; the legend gives their number, n, or its range over the panels)."""
    from matplotlib.lines import Line2D

    ok = [r for r in records if r["dataset"] == dataset and r["status"] == "ok"]
    epsilons = sorted({r["target_epsilon"] for r in ok}, reverse=True)
    fig, axes = panels(len(epsilons), 4.6, 3.4)
    seeds_run: dict[int, list[int]] = {}
    for ax, eps in zip(axes, epsilons):
        for i, column in enumerate(columns):
            mine = [r for r in ok if r["target_epsilon"] == eps and r["mechanism"] == column.mechanism
                    and r["calibrated_with"] == column.calibrated_with]
            if mine:
                ax.plot(*mean_curve(mine), ".-", color=f"C{i}")
                seeds_run.setdefault(i, []).append(len(mine))
        ax.set(xlabel="step", ylabel="test accuracy (%)", title=f"{dataset}, target eps {eps:g}")
        ax.grid(alpha=0.3)
    labels = [f"{columns[i].label}, n={min(n)}" + (f"-{max(n)}" if max(n) > min(n) else "")
              for i, n in sorted(seeds_run.items())]
    if labels:
        fig.legend([Line2D([], [], color=f"C{i}", marker=".") for i in sorted(seeds_run)], labels,
                   loc="outside lower center", ncol=min(3, len(labels)), fontsize=8, frameon=False)
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
    curves = {name: noise_needed(name, epsilons) for name in ("gaussian", "lap2", "lap2-paper")}
    std_factor = {"gaussian": 1.0, "lap2": np.sqrt(2.0), "lap2-paper": np.sqrt(2.0)}
    style = {"gaussian": "C0o-", "lap2": "C3o-", "lap2-paper": "C3x--"}
    fig, (ax_p, ax_s) = panels(2, 5.5, 4.0)
    for name, values in curves.items():
        label = name + (" (NOT a valid bound)" if name == "lap2-paper" else "")
        ax_p.plot(epsilons, values, style[name], label=label)
        ax_s.plot(epsilons, std_factor[name] * np.asarray(values), style[name], label=label)
    ax_p.set(xlabel="target epsilon", ylabel="sigma (Gaussian) or b (Laplace)", title="noise parameter")
    ax_s.set(xlabel="target epsilon", ylabel="noise std per coordinate", title="noise standard deviation")
    for ax in (ax_p, ax_s):
        log_scale(ax, "x")
        log_scale(ax, "y")
        ax.grid(alpha=0.3, which="both")
    shared_legend(fig, (ax_p, ax_s))
    s = NOISE_FIGURE_SETTING
    save_figure(fig, f"Noise needed for (eps, delta={s['delta']:g}): q={s['sample_rate']}, T={s['steps']}, "
                f"C={s['clip']:g}, n={s['params']} (Lap2 paper, MNIST setting)", out)
    return {"epsilons": list(map(float, epsilons)), **curves}


def alpha_grid_figure(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """The Dirichlet-mechanism paper's Fig. 2 (reduced): accuracy vs learning rate (left) and vs
    effective lr (right) per alpha."""
    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax_lr, ax_eff) = panels(2, 5.5, 4.0)
    for i, alpha in enumerate(sorted({r["alpha"] for r in ok})):
        mine = sorted((r for r in ok if r["alpha"] == alpha), key=lambda r: r["effective_lr"])
        acc = [100 * r["accuracy_mean"] for r in mine]
        ax_lr.plot([r["lr"] for r in mine], acc, "o-", color=f"C{i}", label=f"alpha={alpha:g}")
        ax_eff.plot([r["effective_lr"] for r in mine], acc, "o-", color=f"C{i}", label=f"alpha={alpha:g}")
    ax_lr.set(xlabel="learning rate gamma", ylabel="test accuracy (%)", title="vs learning rate")
    ax_eff.set(xlabel="effective lr gamma * kappa(0.9; r, alpha)", ylabel="test accuracy (%)",
               title="vs effective learning rate")
    log_scale(ax_lr, "x")
    log_scale(ax_eff, "x", sorted({r["effective_lr"] for r in ok}) or None)
    for ax in (ax_lr, ax_eff):
        ax.grid(alpha=0.3)
    shared_legend(fig, (ax_lr, ax_eff))
    return save_figure(fig, "Dirichlet mechanism at eps = 1 (r = r*(alpha)), SGD", out)
