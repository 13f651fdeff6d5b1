"""The privacy loss distribution of the two-class Dirichlet mechanism (docs/theory/dirichlet.md Sec. 1.3).

With two classes the Dirichlet mechanism releases p~_1 ~ Beta(alpha + r s_1, alpha + r (1 - s_1)),
a one-parameter exponential family in s_1 with statistic logit(p~_1).  Its likelihood ratios are
monotone, so the vertex pair P_1 = Beta(alpha + r, alpha), P_0 = Beta(alpha, alpha + r) dominates
every pair of inputs (a dominating pair: Zhu, Dong & Wang, "Optimal accounting of differential
privacy via characteristic function", arXiv 2106.08567): for every epsilon the hockey-stick
divergence of any two released laws is at most that of (P_1, P_0).  Under replace-one adjacency
with each sampled example's sample released (Sec. 2.0), one step's view of the changed example is
(1 - q) bot + q P_1 against (1 - q) bot + q P_0, whose privacy loss is 0 with probability 1 - q and
L = r logit(X), X ~ P_1, with probability q.  Dominating pairs compose, so the T-fold composition of
this pair's PLD bounds T steps.  For more than two classes no dominating pair is known.

The PLD is discretised pessimistically by rounding every loss UP to the grid (the "privacy buckets"
rule; every hockey-stick value and every composition can only grow), the loss above the window goes
to the infinity mass and the loss below it to the window's lowest cell, and every mass is raised by a
bound on its floating-point error: the result's epsilon(delta) is never below the exact one.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from scipy.special import betainc, expit

from dpnoise.accounting.pld.tilted import GridPmf
from dpnoise.accounting.validation import check_positive, check_sample_rate

#: Relative error bound of ``betainc`` at the arguments used here, 4 times the largest error
#: (513 u at alpha = 100) found against 40-digit mpmath for alpha in [0.01, 100], r in [1e-4, 5]
#: and |logit| <= 700 (the ``expit`` of the argument included).
_BETAINC_ERROR = 2048 * 2.0**-53
#: Tail mass of logit(X) outside the window (up to the constants of the tails' asymptotics).
_WINDOW_TAIL_MASS = 1e-30
#: The window's half-width in logit(X): expit(-700) is still a normal double.
_MAX_LOGIT = 700.0
#: The (r, alpha) ranges over which ``_BETAINC_ERROR`` was checked; the PLD is offered only there.
CHECKED_R = (1e-4, 5.0)
CHECKED_ALPHA = (0.01, 100.0)


def two_class_domain_problem(r: float, alpha: float) -> Optional[str]:
    """Why the two-class PLD is not offered at (r, alpha): outside the ranges where its error bound on
    the incomplete Beta function was checked (None inside them)."""
    if not CHECKED_R[0] <= r <= CHECKED_R[1] or not CHECKED_ALPHA[0] <= alpha <= CHECKED_ALPHA[1]:
        return (f"r={r:g}, alpha={alpha:g} outside the range of the two-class PLD's error bound "
                f"(r in [{CHECKED_R[0]:g}, {CHECKED_R[1]:g}], alpha in [{CHECKED_ALPHA[0]:g}, {CHECKED_ALPHA[1]:g}])")
    return None


def two_class_logit_window(r: float, alpha: float) -> tuple[float, float]:
    """(lowest, highest) logit(X) kept in the window for X ~ Beta(alpha + r, alpha).

    The tails decay as e^{(alpha + r) t} on the left and e^{-alpha t} on the right.
    """
    log_tail = math.log(_WINDOW_TAIL_MASS)
    return max(log_tail / (alpha + r), -_MAX_LOGIT), min(-log_tail / alpha, _MAX_LOGIT)


def two_class_loss_range(r: float, alpha: float) -> tuple[float, float]:
    """(lowest, highest) privacy loss on the grid of :func:`two_class_vertex_pmfs` (before rounding)."""
    lowest, highest = two_class_logit_window(r, alpha)
    return r * lowest, r * highest


def _vertex_loss_distribution(losses: np.ndarray, r: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """P_1(L <= l) for l <= 0 and P_1(L > l) for l > 0, L = r logit(X), X ~ Beta(alpha + r, alpha).

    Each through the tail it is small in (1 - I_x(a, b) = I_{1-x}(b, a)), so both stay accurate.
    """
    lower = betainc(alpha + r, alpha, expit(np.minimum(losses, 0.0) / r))
    upper = betainc(alpha, alpha + r, expit(-np.maximum(losses, 0.0) / r))
    return lower, upper


def two_class_vertex_masses(sample_rate: float, r: float, alpha: float,
                            discretization: float) -> tuple[int, np.ndarray, float]:
    """(lowest grid index, masses, infinity mass) of the pessimistic single-step PLD.

    ``masses[i]`` is at loss (lowest + i) * discretization and bounds from above the probability,
    under (1 - q) bot + q P_1, that the loss rounded up to the grid equals it; the infinity mass bounds
    the probability of a loss above the window.  Cell (k - 1, k] of L has mass
    q (F(k h) - F((k - 1) h)), computed from the lower tail F left of 0 and the upper tail right of 0,
    and raised by ``_BETAINC_ERROR`` times the two values involved.
    """
    q = check_sample_rate("sample_rate", sample_rate)
    r = check_positive("r", r)
    alpha = check_positive("alpha", alpha)
    h = check_positive("discretization", discretization)
    low_loss, high_loss = two_class_loss_range(r, alpha)
    lowest, highest = math.ceil(low_loss / h), math.ceil(high_loss / h)
    edges = h * np.arange(lowest - 1, highest + 1, dtype=float)
    lower, upper = _vertex_loss_distribution(edges, r, alpha)
    left = np.clip(np.diff(lower), 0.0, None) + _BETAINC_ERROR * (lower[:-1] + lower[1:])
    right = np.clip(-np.diff(upper), 0.0, None) + _BETAINC_ERROR * (upper[:-1] + upper[1:])
    cells = np.where(edges[1:] <= 0.0, left, right)
    cells[0] = lower[1] * (1 + _BETAINC_ERROR)  # everything up to the lowest grid point (edges[1] <= 0)
    masses = q * cells * (1 + 4 * 2.0**-53)
    masses[-lowest] += 1.0 - q  # bot: loss exactly 0, grid index 0
    infinity_mass = min(1.0, q * upper[-1] * (1 + _BETAINC_ERROR) * (1 + 4 * 2.0**-53))
    return lowest, masses, infinity_mass


def two_class_vertex_pmfs(sample_rate: float, r: float, alpha: float, discretization: float) -> tuple[GridPmf, GridPmf]:
    """The single-step PMFs (both directions: the pair is symmetric, one PMF serves both) of one
    Poisson-sampled step of the two-class Dirichlet mechanism, replace-one adjacency.

    A pessimistic bound for every pair of two-class inputs (docs/theory/dirichlet.md Sec. 1.3);
    NOT valid for more than two classes.  Every mass is already raised by its error bound, so the
    tail sums need no relative error.
    """
    lowest, masses, infinity_mass = two_class_vertex_masses(sample_rate, r, alpha, discretization)
    pmf = GridPmf(lowest, masses, infinity_mass)
    return pmf, pmf
