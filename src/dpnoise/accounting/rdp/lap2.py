"""Lap2: L2-clipped Laplace DP-SGD (Mohammady et al., arXiv 2602.23516) -- the paper's accountant and a sound one.

``noise_multiplier = b / C`` (b: absolute Laplace scale on the sum of clipped gradients, C: L2
clipping norm); ``num_params = n``.  Integer orders only (+inf at fractional orders).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from dpnoise.accounting.rdp.gaussian import gaussian_base_log_moments
from dpnoise.accounting.rdp.laplace import (
    laplace_moment_excess_grid,
    log_laplace_moment_excess,
    weighted_log_laplace_moments,
)
from dpnoise.accounting.rdp.logmath import (
    log_binomial_mixture,
    log_binomial_weights,
    matmul_blocked,
)
from dpnoise.accounting.rdp.majorization import majorization_rule
from dpnoise.accounting.rdp.orders import on_integer_orders
from dpnoise.accounting.rdp.subsampling import (
    log_moment_add_direction,
    sound_subsampled_rdp,
)

# Points with (max_order - 1) * t above this are summed in log space (linear space would overflow).
_LINEAR_LIMIT = 600.0
# Orders per block of the lap2-paper matrix product (each block stops at its largest order's eta).
_ORDER_GROUP = 64
#: relative raise of the majorization sum for its rounding (10x the fast sum's documented accuracy)
SUM_ROUNDING = 1e-13


def majorization_log_moments(noise_multiplier: float, num_params: int, max_order: int) -> np.ndarray:
    """Bound (a) of docs/theory/lap2.md §4: sum_i log F(x_i / b, eta) >= sup_{||v||_2 <= C} S_eta(v).

    log F(., eta) is convex increasing with value 0 at 0, and |v| sorted is weakly submajorized
    by x (Lap2 paper, Lemma III.6), so the majorization sum bounds the base log-moment.  The sum is
    evaluated with the rigorous ``upper`` rule of :mod:`dpnoise.accounting.rdp.majorization`, and
    raised by :data:`SUM_ROUNDING` (relative): the fast weighted sum agrees with the term-by-term
    sum to ~1e-14 only, so without it a sum over few coordinates can come out a few ulp below the
    true sum.
    """
    rule = majorization_rule(int(num_params), "upper")
    moments = weighted_log_laplace_moments(rule.shifts(1.0 / noise_multiplier), rule.weights, max_order)
    return moments * (1.0 + SUM_ROUNDING)  # log-moments are >= 0: a relative raise is upward


def lap2_base_log_moments(noise_multiplier: float, num_params: int, max_order: int) -> np.ndarray:
    """R(eta) = min(majorization bound (a), Gaussian-domination bound (b)) (docs/theory/lap2.md §4).

    (b): log F(u, eta) <= eta (eta-1) u^2 / (2 b^2) for u >= 0 (proof in the spec), so
    S_eta(v) <= eta (eta-1) C^2 / (2 b^2) for every ||v||_2 <= C, whatever n.
    """
    gaussian = gaussian_base_log_moments(noise_multiplier, max_order)
    return np.minimum(majorization_log_moments(noise_multiplier, num_params, max_order), gaussian)


def lap2_add_only_rdp(
    q: float, noise_multiplier: float, num_params: int, orders: np.ndarray
) -> np.ndarray:
    """Add direction only: exact binomial expansion with R = :func:`lap2_base_log_moments`.

    One Bernoulli draw includes the example in all coordinates at once, so
    E_Q[(mu/Q)^a] = sum_eta w_eta E_Q[(P_v/Q)^eta] = sum_eta w_eta exp(S_eta(v)) <= sum_eta w_eta e^{R(eta)}.
    Covers D_a(mu || Q) only, not the remove direction D_a(Q || mu).
    """

    def compute(ints: np.ndarray) -> np.ndarray:
        base = lap2_base_log_moments(noise_multiplier, num_params, int(ints.max()))
        return log_moment_add_direction(q, ints, base) / (ints - 1)

    return on_integer_orders(orders, compute)


def lap2_sound_rdp(
    q: float, noise_multiplier: float, num_params: int, orders: np.ndarray
) -> np.ndarray:
    """The default, sound Lap2 accountant (docs/theory/lap2.md §4), both adjacency directions:
    :func:`~dpnoise.accounting.rdp.subsampling.sound_subsampled_rdp` fed with R(eta) = min(majorization,
    Gaussian domination), a bound for every shift with ||v||_2 <= C."""
    return sound_subsampled_rdp(q, orders, lambda max_order: lap2_base_log_moments(noise_multiplier, num_params,
                                                                                    max_order))


def _paper_log_moments(q: float, t: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """log sum_eta w_eta(a) F(t_p, eta) for every point t_p and order a: shape (points, orders)."""
    max_order = int(orders.max())
    eta = np.arange(max_order + 1)
    log_w = log_binomial_weights(q, orders)  # (orders, eta)
    out = np.empty((t.size, orders.size))
    linear = (max_order - 1) * t <= _LINEAR_LIMIT
    # sum_eta w_eta (F - 1) is a sum of non-negative terms: a matrix product in linear space,
    # by groups of orders, each over eta <= its largest order (w_eta(a) = 0 for eta > a).
    excess = laplace_moment_excess_grid(t[linear], max_order)  # (points, eta)
    weights = np.exp(log_w)
    sums = np.empty((excess.shape[0], orders.size))
    by_order = np.argsort(orders, kind="stable")
    for group in np.array_split(by_order, -(-orders.size // _ORDER_GROUP)):
        top = int(orders[group].max()) + 1
        sums[:, group] = matmul_blocked(excess[:, :top], weights[group, :top].T)
    out[linear] = np.log1p(sums)
    for p in np.flatnonzero(~linear):
        log_excess = log_laplace_moment_excess(t[p], eta)
        if 0.0 < q < 1.0:  # the same sum in log space, row by row (log_excess = -inf at eta < 2)
            out[p] = np.logaddexp(0.0, log_binomial_mixture(q, orders, log_excess))
        else:
            out[p] = np.logaddexp(0.0, logsumexp(log_w + log_excess[None, :], axis=1))
    return out


def lap2_paper_rdp(
    q: float, noise_multiplier: float, num_params: int, orders: np.ndarray
) -> np.ndarray:
    """The Lap2 paper's accountant exactly as published (Lap2 paper, Thm III.7; docs/theory/lap2.md §3).

    alpha(lam) = sum_{i=1}^n log sum_{eta=0}^{lam+1} w_eta F(x_i, eta), i.e. D_a = alpha(a-1)/(a-1).
    NOT a valid privacy bound in general: it subsamples every coordinate independently, whereas the
    real mechanism includes an example in all coordinates with one Bernoulli draw.  The sum over
    i = 1..n uses the ``accurate`` Euler-Maclaurin rule (about 1e-13 relative to the exact sum).
    """

    def compute(ints: np.ndarray) -> np.ndarray:
        rule = majorization_rule(int(num_params), "accurate")
        per_point = _paper_log_moments(q, rule.shifts(1.0 / noise_multiplier), ints)
        return rule.apply(per_point) / (ints - 1)

    return on_integer_orders(orders, compute)
