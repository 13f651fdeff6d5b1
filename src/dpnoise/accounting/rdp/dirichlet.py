"""Dirichlet mechanism (Ponnoprat 2023) under Poisson subsampling; docs/theory/dirichlet.md §1-3.

Mechanism: p~ ~ Dir(r s + alpha 1_d) for a softmax vector s; labels public, inputs private.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy.special import digamma, gammaln, logsumexp, polygamma

from dpnoise.accounting.rdp.curve import monotone_envelope
from dpnoise.accounting.rdp.orders import on_integer_orders
from dpnoise.accounting.rdp.subsampling import (
    log_moment_add_direction,
    log_moment_shared_inclusion,
    log_moment_zhu_wang_general,
)

DirichletBase = Literal["ponnoprat", "exact-vertex"]
DirichletSubsampling = Literal["replace-one", "general", "tight"]


def dirichlet_max_order(r: float, alpha: float) -> float:
    """Orders must satisfy a < 1 + alpha / r (the Dirichlet parameters stay positive)."""
    return 1.0 + alpha / r


def ponnoprat_rdp(r: float, alpha: float, orders: np.ndarray) -> np.ndarray:
    """eps_P(a) = a r^2 psi'(alpha - (a-1) r)  for 1 < a < 1 + alpha/r, +inf beyond.

    Ponnoprat (TMLR 2023) RDP bound with Delta_2^2 = 2, Delta_inf = 1 (docs/theory/dirichlet.md §1.1).
    """
    a = np.asarray(orders, dtype=float)
    ok = a < dirichlet_max_order(r, alpha)
    arg = np.where(ok, alpha - (a - 1) * r, 1.0)
    with np.errstate(over="ignore"):  # r^2 beyond double range: +inf, still an upper bound
        return np.where(ok, a * np.float64(r) ** 2 * polygamma(1, arg), np.inf)


#: Unit round-off of float64.
_UNIT_ROUNDOFF = 2.0**-53
#: Error model of SciPy's special functions, 8 times what a check against 40-digit mpmath over
#: 5,000 arguments in [1e-12, 1e4] (clustered at the zeros 1 and 2 of lnGamma) found:
#: |gammaln(x) - lnG(x)| <= 3.9 u (|lnG(x)| + 1) and |polygamma(n, x) / psi^(n)(x) - 1| <= 7.9 u, n = 1, 3, 5.
_LOG_GAMMA_ERROR = 32 * _UNIT_ROUNDOFF
_POLYGAMMA_ERROR = 64 * _UNIT_ROUNDOFF
#: Real orders from which the two-vertex value is proven for every alpha > 0: just above the root
#: 1.5803352 of the pole-part condition of docs/theory/dirichlet.md Sec. 1.2 (step 4).
VERTEX_REAL_ORDER_MIN = 1.58034
#: From this alpha on, the two-vertex value is proven at every real order > 1 (Sec. 1.2, step 4).
VERTEX_ALPHA_ALL_ORDERS = 0.5


def vertex_bound_holds(alpha: float, orders: np.ndarray) -> np.ndarray:
    """Where the two-vertex value is proven to be the worst case (docs/theory/dirichlet.md Sec. 1.2).

    Every integer order >= 2 and every real order >= 1.58034; every real order > 1 when alpha >= 1/2.
    """
    a = np.asarray(orders, dtype=float)
    minimum = 1.0 if alpha >= VERTEX_ALPHA_ALL_ORDERS else VERTEX_REAL_ORDER_MIN
    return (a > 1.0) & (a >= minimum)


def _smallest_argument(r: float, alpha: float, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """alpha - (a-1) r as computed, and a bound on its rounding error (two roundings, doubled)."""
    shift = (a - 1) * r  # a - 1 is exact for a >= 1
    x = alpha - shift
    return x, 4 * _UNIT_ROUNDOFF * (shift + np.abs(x))


def _vertex_rdp_direct(r: float, alpha: float, a: np.ndarray) -> np.ndarray:
    """Upper bound on eps_exact(a) from its four log-Gamma values (docs/theory/dirichlet.md Sec. 1.2).

    Raised by the error model of ``gammaln`` (``_LOG_GAMMA_ERROR`` (|lnG| + 1) each), by |psi|
    times the rounding error of each argument, and by the rounding of the sum and the division.
    Accurate where eps_exact is not tiny; for small r the terms cancel and the allowance dominates.
    """
    smallest, smallest_error = _smallest_argument(r, alpha, a)
    largest = alpha + a * r
    middle = np.full_like(a, alpha + r)
    arguments = np.stack([largest, smallest, middle, np.full_like(a, float(alpha))])
    argument_errors = np.stack([4 * _UNIT_ROUNDOFF * largest, smallest_error,
                                4 * _UNIT_ROUNDOFF * middle, np.zeros_like(a)])
    valid = smallest - smallest_error > 0
    low = np.where(valid, arguments - argument_errors, 1.0)
    high = np.where(valid, arguments + argument_errors, 1.0)
    psi_bound = np.maximum(np.abs(digamma(low)), np.abs(digamma(high)))
    log_gammas = gammaln(np.where(valid, arguments, 1.0))
    signed = log_gammas * np.array([1.0, 1.0, -1.0, -1.0])[:, None]
    allowance = (_LOG_GAMMA_ERROR * (np.abs(log_gammas) + 1) + 2 * psi_bound * argument_errors).sum(axis=0)
    allowance += 4 * _UNIT_ROUNDOFF * np.abs(log_gammas).sum(axis=0)
    value = (signed.sum(axis=0) + allowance) / np.where(valid, a - 1, 1.0) * (1 + 2 * _UNIT_ROUNDOFF)
    return np.where(valid, value, np.inf)


def _vertex_rdp_series(r: float, alpha: float, a: np.ndarray) -> np.ndarray:
    """Upper bound on eps_exact(a) without cancellation, accurate for small r (docs/theory/dirichlet.md Sec. 1.2).

    (a-1) eps_exact(a) = int_0^{(a-1)r} int_0^{a r} psi'(alpha - (a-1) r + t + s) ds dt, so
    eps_exact(a) = a r^2 E[psi'(alpha - (a-1) r + U)] with U the sum of independent uniforms on
    [0, (a-1) r] and [0, a r], symmetric about its mean: by Taylor's theorem about alpha + r/2,
    E[psi'] <= psi'(alpha + r/2) + psi'''(alpha + r/2) Var U / 2 + psi^(5)(alpha - (a-1) r) E(U - EU)^4 / 24
    (psi^(5) > 0 decreases).  Summed in log space (no underflow); the polygamma arguments are
    lowered by their rounding error (psi', psi''', psi^(5) decrease), the value raised by its own.
    """
    smallest, smallest_error = _smallest_argument(r, alpha, a)
    smallest = smallest - smallest_error
    centre = (alpha + 0.5 * r) * (1 - 4 * _UNIT_ROUNDOFF)
    valid = smallest > 0
    with np.errstate(divide="ignore", over="ignore"):
        log_polygammas = np.log(np.stack([np.full_like(a, polygamma(1, centre)), np.full_like(a, polygamma(3, centre)),
                                          polygamma(5, np.where(valid, smallest, 1.0))]))
        log_r = np.log(r)
        shorter, longer = a - 1, a
        log_variance = 2 * log_r + np.log((shorter**2 + longer**2) / 12)
        log_fourth_moment = 4 * log_r + np.log((shorter**4 + longer**4) / 80 + (shorter * longer) ** 2 / 24)
        log_terms = np.stack([log_polygammas[0], log_polygammas[1] + log_variance - np.log(2.0),
                              log_polygammas[2] + log_fourth_moment - np.log(24.0)]) + np.log(a) + 2 * log_r
        log_value = logsumexp(log_terms, axis=0)
        # log_value's absolute rounding error is a few u times the magnitudes that were added up
        magnitude = np.abs(log_terms).max(axis=0) + 6 * abs(log_r) + np.abs(log_polygammas).max(axis=0) + 10
        value = np.exp(log_value + 8 * _UNIT_ROUNDOFF * magnitude) * (1 + _POLYGAMMA_ERROR)
    return np.where(valid, value, np.inf)


def exact_vertex_rdp(r: float, alpha: float, orders: np.ndarray) -> np.ndarray:
    """Worst case over two distinct simplex vertices (docs/theory/dirichlet.md Sec. 1.2), as an upper bound.

    eps(a) = [lnG(alpha + a r) + lnG(alpha - (a-1) r) - lnG(alpha + r) - lnG(alpha)] / (a - 1), the
    supremum of D_a over pairs of inputs at the orders of :func:`vertex_bound_holds`; +inf for
    a >= 1 + alpha / r.  Computed as the smaller of two bounds that include their rounding error:
    from the four log-Gamma values (:func:`_vertex_rdp_direct`, accurate unless r is small) and a
    Taylor form of the same quantity (:func:`_vertex_rdp_series`, accurate for small r, where the
    log-Gamma values cancel).  Never below the exact value, and positive.
    """
    a = np.asarray(orders, dtype=float)
    ok = (a < dirichlet_max_order(r, alpha)) & (a > 1)
    safe = np.where(ok, a, 2.0)
    value = np.minimum(_vertex_rdp_direct(r, alpha, safe), _vertex_rdp_series(r, alpha, safe))
    return np.where(ok, np.maximum(value, np.finfo(float).tiny), np.inf)


def sampled_dirichlet_rdp(
    q: float,
    r: float,
    alpha: float,
    orders: np.ndarray,
    base: DirichletBase = "exact-vertex",
    subsampling: DirichletSubsampling = "replace-one",
) -> np.ndarray:
    """RDP of the Poisson-subsampled Dirichlet mechanism (+inf at orders without a bound).

    ``replace-one`` (the default): replace-one adjacency with each sampled example's sample released,
    exact (:func:`~dpnoise.accounting.rdp.subsampling.log_moment_shared_inclusion`) at every order of
    :func:`vertex_bound_holds`, real orders included (Ponnoprat's base is above the two-vertex value
    there, docs/theory/dirichlet.md Sec. 1.2).  ``general``: Zhu & Wang (2019) Thm 9 for add/remove
    adjacency, applied to the replace-one base bound as the Dirichlet paper's Theorem 10 does; under
    replace-one adjacency it is below the truth (docs/theory/dirichlet.md, pitfall "Reading of
    Theorem 10").  ``tight``: Zhu & Wang's tight form, whose extra condition is also unproven for the
    Dirichlet mechanism (§2.2).  Both Zhu & Wang forms are given at integer orders only.
    """
    base_fn = {"ponnoprat": ponnoprat_rdp, "exact-vertex": exact_vertex_rdp}[base]
    orders = np.asarray(orders, dtype=float)
    if subsampling == "replace-one":
        rdp = np.full(orders.shape, np.inf)
        proven = vertex_bound_holds(alpha, orders)
        a = orders[proven]
        rdp[proven] = log_moment_shared_inclusion(q, (a - 1) * base_fn(r, alpha, a)) / (a - 1)
    else:
        combine = {"general": log_moment_zhu_wang_general, "tight": log_moment_add_direction}[subsampling]

        def compute(ints: np.ndarray) -> np.ndarray:
            eta = np.arange(int(ints.max()) + 1, dtype=float)
            base_log_moments = np.zeros_like(eta)
            base_log_moments[2:] = (eta[2:] - 1) * base_fn(r, alpha, eta[2:])
            return combine(q, ints, base_log_moments) / (ints - 1)

        rdp = on_integer_orders(orders, compute)
    # Each order's value is a bound (exact for replace-one), so the running min from the right is too.
    return rdp if subsampling == "tight" else monotone_envelope(orders, rdp)
