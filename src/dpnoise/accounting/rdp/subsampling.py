"""Privacy amplification by Poisson subsampling, in log-moment form.

All functions take ``base_log_moments``: an array ``R`` with ``R[eta] >= sup log E_Q[(P/Q)^eta]``
for eta = 0..max(orders) (so R[0] = R[1] = 0), i.e. ``R[eta] = (eta - 1) * eps_base(eta)``, and
return the log-moment ``M(a) = (a - 1) * D_a`` of the subsampled mechanism at integer orders ``a``.
``+inf`` entries (orders where the base mechanism has no finite RDP) propagate.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.special import gammaln

from dpnoise.accounting.rdp.curve import monotone_envelope
from dpnoise.accounting.rdp.logmath import log_binomial_mixture, log_expm1
from dpnoise.accounting.rdp.orders import on_integer_orders

_LOG3 = float(np.log(3.0))
#: below this, e^R - 1 is finite in double precision
_EXPM1_LIMIT = 700.0


def _mixture(q: float, orders: np.ndarray, log_terms: np.ndarray) -> np.ndarray:
    """log1p(sum_{eta >= 2, eta <= a} exp(log w[a, eta] + log_terms[eta]))."""
    return np.logaddexp(0.0, log_binomial_mixture(q, orders, log_terms))


def _unsampled(orders: np.ndarray, base_log_moments: np.ndarray) -> np.ndarray:
    return np.asarray(base_log_moments, dtype=float)[np.asarray(orders, dtype=int)]


def log_moment_add_direction(
    q: float, orders: np.ndarray, base_log_moments: np.ndarray
) -> np.ndarray:
    """Exact binomial expansion E_Q[((1-q) + q P/Q)^a] = sum_eta C(a,eta)(1-q)^(a-eta) q^eta E_Q[(P/Q)^eta].

    Mironov, Talwar, Zhang (2019), Sec. 3.3, Eq. (3); Lap2 paper, Thm III.2.  This is the add direction
    D_a((1-q)Q + qP || Q).  It is also Zhu & Wang (2019)'s *tight* form (their Thm 6 under its
    extra condition, met by Gaussian and Laplace), since sum_eta w_eta = 1.
    """
    if q == 1.0:
        return _unsampled(orders, base_log_moments)
    return _mixture(q, orders, log_expm1(np.asarray(base_log_moments, dtype=float)))


def log_moment_shared_inclusion(q: float, base_log_moments: np.ndarray) -> np.ndarray:
    """Replace-one adjacency for a mechanism that releases each sampled example's own output.

    ``base_log_moments``: R(a) = (a-1) eps_base(a) AT the orders wanted (any real a > 1), not indexed
    by eta like the other functions here.  The changed example is sampled with probability q under
    both datasets (one coin), and when it is not, nothing of it is released; so one step's outputs
    are P' = (1-q) 1_bot + q P against Q' = (1-q) 1_bot + q Q, with "not sampled" (bot) outside the
    support of P and Q, and E_Q'[(P'/Q')^a] = 1 - q + q E_Q[(P/Q)^a] exactly:
    (a-1) eps(a) = log(1 - q + q e^{R(a)}) (docs/theory/dirichlet.md, pitfall "Reading of
    Theorem 10").  Linear in q for small q: the example's inclusion is visible in the output, so
    there is no q^2 amplification as in Zhu & Wang's add/remove bounds.
    """
    R = np.asarray(base_log_moments, dtype=float)
    if q == 1.0:
        return R
    # log1p(q expm1(R)) keeps its relative accuracy for small R, where 1 - q + q e^R rounds to 1
    # (logaddexp there can come out below the truth); logaddexp beyond, where expm1 overflows.
    small = R < _EXPM1_LIMIT
    with np.errstate(over="ignore"):
        value = np.where(small, np.log1p(q * np.expm1(np.where(small, R, 0.0))),
                         np.logaddexp(np.log1p(-q), np.log(q) + R))
    return value * (1.0 + 8 * np.finfo(float).eps)  # >= 0: raised by a few ulp of its rounding


def log_moment_zhu_wang_general(
    q: float, orders: np.ndarray, base_log_moments: np.ndarray
) -> np.ndarray:
    """Zhu & Wang (2019), "Poisson subsampled Renyi DP", Thm 9 (general upper bound, any mechanism).

    (a-1) eps(a) <= log{ (1-q)^(a-1)(aq - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^{eps(2)}
                         + 3 sum_{l=3}^{a} C(a,l)(1-q)^(a-l) q^l e^{(l-1) eps(l)} }
    (docs/theory/dirichlet.md §2.1), rewritten as log1p of non-negative terms:
    w_2 (e^{R_2} - 1) + sum_{l>=3} w_l (3 e^{R_l} - 1).
    """
    R = np.asarray(base_log_moments, dtype=float)
    if q == 1.0:
        return _unsampled(orders, R)
    with np.errstate(over="ignore"):
        log_three_e_r_minus_one = _LOG3 + R + np.log1p(-np.exp(-R) / 3.0)
    eta = np.arange(R.shape[0])
    log_terms = np.where(eta >= 3, log_three_e_r_minus_one, log_expm1(R))
    return _mixture(q, orders, log_terms)


def log_negative_binomial_excess(q: float, lam: np.ndarray) -> np.ndarray:
    """log c_lam, c_lam = (1-q)^(-lam) - 1 - lam q  (docs/theory/lap2.md §4, remove direction).

    Direct formula when lam q > 0.01; otherwise the positive series
    c_lam = sum_{k>=2} C(lam+k-1, k) q^k (negative binomial expansion), which avoids cancellation.
    """
    lam = np.asarray(lam, dtype=float)
    with np.errstate(over="ignore", divide="ignore"):
        big_l = -lam * np.log1p(-q)
        direct = np.where(
            big_l < 50,
            np.log(np.maximum(np.expm1(np.minimum(big_l, 50)) - lam * q, 1e-300)),
            big_l + np.log1p(-(1 + lam * q) * np.exp(-np.maximum(big_l, 50))),
        )
    out = direct
    series_rows = lam * q <= 0.01
    if series_rows.any():  # only where used: the series costs ~40 log-Gamma values per order
        k = np.arange(2, 40, dtype=float)[None, :]
        lam_col = np.maximum(lam[series_rows], 1e-300)[:, None]
        out = direct.copy()
        log_terms = gammaln(lam_col + k) - gammaln(k + 1) - gammaln(lam_col) + k * np.log(q)
        peak = log_terms.max(axis=1)  # finite: every term is positive
        out[series_rows] = np.log(np.exp(log_terms - peak[:, None]).sum(axis=1)) + peak
    return out


def log_moment_remove_direction_bound(
    q: float, orders: np.ndarray, log_second_moment: float
) -> np.ndarray:
    """Remove direction, elementary lemma (docs/theory/lap2.md §4):

    E_mu[(Q/mu)^a] = E_Q[(1-q+qX)^-(a-1)] <= 1 + c_{a-1} (E_Q X^2 - 1),  X = P/Q, mu = (1-q)Q + qP,
    with ``log_second_moment >= log E_Q X^2``.  Infinite at q = 1 (the lemma needs q < 1).
    """
    orders = np.asarray(orders, dtype=float)
    if q == 1.0:
        return np.full(orders.shape, np.inf)
    log_c = log_negative_binomial_excess(q, orders - 1.0)
    return np.logaddexp(0.0, log_c + log_expm1(np.asarray(log_second_moment, dtype=float)))


def sound_subsampled_rdp(q: float, orders: np.ndarray, base_log_moments: Callable[[int], np.ndarray]) -> np.ndarray:
    """RDP of a Poisson-subsampled mechanism in both add/remove directions, at the integer orders of
    ``orders`` (+inf at the others), from ``base_log_moments(max_order)``: R[eta] >= sup log E_Q[(P/Q)^eta]
    over the mechanism's neighbouring pairs, eta = 0..max_order, for a mechanism whose noise is symmetric
    (so that R bounds both directions of the pair).

    Per order: min(max(add-direction expansion, remove-direction lemma), Zhu-Wang general bound)
    (docs/theory/lap2.md §4); each is a proven upper bound on the subsampled log-moment given R, hence so
    is the min, and so is the running min from the right (the monotone envelope).
    """

    def compute(ints: np.ndarray) -> np.ndarray:
        base = base_log_moments(int(ints.max()))
        add = log_moment_add_direction(q, ints, base)
        remove = log_moment_remove_direction_bound(q, ints, base[2])
        general = log_moment_zhu_wang_general(q, ints, base)
        return np.minimum(np.maximum(add, remove), general) / (ints - 1)

    return monotone_envelope(orders, on_integer_orders(orders, compute))
