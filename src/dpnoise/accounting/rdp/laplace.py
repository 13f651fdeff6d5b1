"""Laplace moments (Lap2 paper, Thm III.2) and the Laplace mechanism with L1 clipping (docs/theory/lap2.md §1, §5)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import gammaln

from dpnoise.accounting.rdp.orders import on_integer_orders
from dpnoise.accounting.rdp.subsampling import log_moment_add_direction

# Below this eta*t the excess F - 1 is summed from non-negative pieces (no cancellation).
_SMALL = 1.0


def _expm1_minus_x(x: np.ndarray) -> np.ndarray:
    """e^x - 1 - x >= 0, accurate near 0 (Taylor series for |x| < 0.1)."""
    x = np.asarray(x, dtype=float)
    xs = np.where(np.abs(x) < 0.1, x, 0.0)
    series = np.zeros_like(xs)
    for k in range(16, 1, -1):  # Horner on x^2 (1/2! + x/3! + ... )
        series = series * xs / (k + 1) + 1.0
    series = series * xs * xs / 2.0
    with np.errstate(over="ignore"):
        direct = np.expm1(x) - x
    return np.where(np.abs(x) < 0.1, series, direct)


def log_laplace_moment_excess(t: np.ndarray, eta: np.ndarray) -> np.ndarray:
    """log(F(t, eta) - 1), broadcasting over t = u/b >= 0 and integer eta >= 0 (-inf at eta in {0, 1}).

    F(t, eta) = E[(p_u/p_0)^eta] = [eta e^{(eta-1)t} + (eta-1) e^{-eta t}] / (2 eta - 1)
    (docs/theory/lap2.md §1).  Since F - 1 = [eta g((eta-1)t) + (eta-1) g(-eta t)]/(2 eta - 1) with
    g(x) = e^x - 1 - x >= 0, small t is computed without cancellation; large t via logaddexp.
    """
    t, eta = np.broadcast_arrays(np.asarray(t, dtype=float), np.asarray(eta, dtype=float))
    trivial = eta <= 1
    e = np.where(trivial, 2.0, eta)
    small = e * t < _SMALL
    ts = np.where(small, t, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess_small = np.log(
            (e * _expm1_minus_x((e - 1) * ts) + (e - 1) * _expm1_minus_x(-e * ts)) / (2 * e - 1)
        )
        log_f = np.logaddexp(np.log(e) + (e - 1) * t, np.log(e - 1) - e * t) - np.log(2 * e - 1)
        excess_large = log_f + np.log(-np.expm1(-log_f))
    return np.where(trivial, -np.inf, np.where(small, excess_small, excess_large))


def log_laplace_moment(t: np.ndarray, eta: np.ndarray) -> np.ndarray:
    """log F(t, eta) (docs/theory/lap2.md §1), accurate for all t >= 0."""
    return np.logaddexp(0.0, log_laplace_moment_excess(t, eta))


def laplace_base_log_moments(noise_multiplier: float, max_order: int) -> np.ndarray:
    """R(eta) = log F(1/noise_multiplier, eta): the 1-D Laplace shift of one clipping norm."""
    return log_laplace_moment(1.0 / noise_multiplier, np.arange(max_order + 1))


# --- Fast kernels over many points and all moment orders eta = 0..max_eta at once --------------
# In tau = eta * t, both F - 1 and log F are power series with radius of convergence >= pi/2 (the
# zeros of F lie at (2 eta - 1) t = log((eta-1)/eta) + i pi (2m+1)).  Below _TAU_SERIES they are
# summed as series (truncation < 1e-18 relative: the terms of log F fall like (2 tau / pi)^k, those
# of F - 1 like tau^k / k!); above it the closed forms lose at most ~1e-15 relative to cancellation.
_TAU_SERIES = 0.5
_SERIES_TERMS = 40
_EXCESS_TERMS = 18


@lru_cache(maxsize=4)
def _series_coefficients(max_eta: int) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, gamma), each (_SERIES_TERMS + 1, max_eta + 1): for integer eta >= 2,

    F(t, eta) - 1 = sum_{k>=2} alpha[k, eta] (eta t)^k and log F(t, eta) = sum_{k>=2} gamma[k, eta] (eta t)^k
    (zero columns at eta in {0, 1}, where F = 1).  alpha from the two exponentials of F; gamma by
    the recurrence k gamma_k = k alpha_k - sum_{j<k} j gamma_j alpha_{k-j} of log F (F' = F (log F)').
    """
    e = np.maximum(np.arange(max_eta + 1, dtype=float), 2.0)
    k = np.arange(_SERIES_TERMS + 1, dtype=float)[:, None]
    alpha = (e * ((e - 1) / e) ** k + (e - 1) * (-1.0) ** k) / ((2 * e - 1) * np.exp(gammaln(k + 1)))
    gamma = np.zeros_like(alpha)
    j = np.arange(_SERIES_TERMS + 1, dtype=float)[:, None]
    for m in range(1, _SERIES_TERMS + 1):
        gamma[m] = alpha[m] - np.einsum("je,je->e", j[1:m] * gamma[1:m], alpha[m - 1 : 0 : -1]) / m
    alpha[:2] = 0.0  # alpha_0 = 1 belongs to F, not to F - 1; alpha_1 = 0
    alpha[:, :2] = 0.0
    gamma[:, :2] = 0.0
    alpha.setflags(write=False)
    gamma.setflags(write=False)
    return alpha, gamma


def _closed_form_log_moment(t: np.ndarray, e: np.ndarray) -> np.ndarray:
    """log F(t, e) = (e-1) t + log1p(-(e-1)/(2e-1) (1 - e^{-(2e-1) t})) for e >= 2 (no overflow).

    Two terms of opposite signs, each ~e t: about 4 ulp / (e t) relative error, i.e. below 1e-15
    where it is used (e t >= _TAU_SERIES).
    """
    return (e - 1) * t + np.log1p((e - 1) / (2 * e - 1) * np.expm1(-(2 * e - 1) * t))


def weighted_log_laplace_moments(t: np.ndarray, weights: np.ndarray, max_eta: int) -> np.ndarray:
    """sum_p weights[p] log F(t[p], eta) for eta = 0..max_eta (t >= 0): shape (max_eta + 1,).

    Same values as ``weights @ log_laplace_moment(t[:, None], eta[None, :])`` to ~1e-14 relative,
    without evaluating every (point, eta) pair twice: pairs with eta t < _TAU_SERIES enter through
    the power series, sum_p w_p log F = sum_k gamma_k(eta) eta^k sum_{p: eta t_p < tau} w_p t_p^k,
    with the inner sums read off suffix sums over the points sorted by t (one small table for all
    eta); the other pairs use the closed form.
    """
    t = np.asarray(t, dtype=float).ravel()
    weights = np.asarray(weights, dtype=float).ravel()
    order = np.argsort(-t, kind="stable")
    t, weights = t[order], weights[order]
    eta = np.arange(max_eta + 1)
    e = np.maximum(eta, 2).astype(float)
    # closed form on the pairs with eta * t >= tau (a prefix of the sorted points for each eta)
    with np.errstate(divide="ignore"):
        n_large = np.searchsorted(-t, -_TAU_SERIES / e, side="right")  # #points with t >= tau / eta
    n_large[:2] = 0
    large = np.arange(t.size)[:, None] < n_large[None, :]
    log_f = np.where(large, _closed_form_log_moment(t[:, None], e[None, :]), 0.0)
    out = np.einsum("p,pe->e", weights, log_f)  # no multi-threaded BLAS call (logmath.matmul_blocked)
    # power series on the others: suffix sums of w_p t_p^k
    _, gamma = _series_coefficients(max_eta)
    k = np.arange(2, _SERIES_TERMS + 1)
    # points with t >= tau / 2 are on the closed-form side for every eta >= 2: left out (as 0)
    t_series = np.where(t < _TAU_SERIES / 2, t, 0.0)
    with np.errstate(under="ignore"):
        powers = weights[:, None] * t_series[:, None] ** k[None, :]
    suffix = np.zeros((t.size + 1, k.size))
    suffix[:-1] = np.cumsum(powers[::-1], axis=0)[::-1]
    with np.errstate(over="ignore", invalid="ignore"):
        series = np.einsum("ek,ek->e", suffix[n_large], gamma[2:].T * e[:, None] ** k[None, :])
    out = out + np.where(eta >= 2, series, 0.0)
    return out


def laplace_moment_excess_grid(t: np.ndarray, max_eta: int) -> np.ndarray:
    """F(t[p], eta) - 1 in linear space for every point p and eta = 0..max_eta: (points, max_eta + 1).

    ~1e-14 relative (+inf where it overflows): the power series in eta t below _TAU_SERIES (its
    terms fall like 1/k!: _EXCESS_TERMS suffice for 1e-18), expm1 of the closed-form log F above
    it; each is evaluated only on the columns (eta) where some point needs it.
    """
    t = np.asarray(t, dtype=float).ravel()
    out = np.zeros((t.size, max_eta + 1))
    if t.size == 0 or max_eta < 2:
        return out
    e = np.arange(max_eta + 1, dtype=float)
    t_min, t_max = float(t.min()), float(t.max())
    # columns with a series entry (eta t_min < tau) and with a closed-form entry (eta t_max >= tau),
    # widened by one on each side against rounding; the masks below decide entry by entry
    series_end = max_eta + 1 if t_min <= 0 else int(min(max_eta + 1, np.ceil(_TAU_SERIES / t_min) + 1))
    closed_start = 2 if t_max <= 0 else int(max(2, min(max_eta + 1, np.floor(_TAU_SERIES / t_max) - 1)))
    if closed_start <= max_eta:
        with np.errstate(over="ignore"):
            out[:, closed_start:] = np.expm1(_closed_form_log_moment(t[:, None], e[None, closed_start:]))
    if series_end > 2:
        alpha, _ = _series_coefficients(max_eta)
        cols = slice(2, series_end)
        tau = e[None, cols] * t[:, None]
        small = tau < _TAU_SERIES
        ts = np.where(small, tau, 0.0)
        series = alpha[_EXCESS_TERMS, cols] * ts + alpha[_EXCESS_TERMS - 1, cols]
        for m in range(_EXCESS_TERMS - 2, 1, -1):
            series *= ts
            series += alpha[m, cols]
        series *= ts * ts
        out[:, cols] = np.where(small, series, out[:, cols])
    return out


def sampled_laplace_rdp(q: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the Poisson-sampled Laplace mechanism with L1 clipping (docs/theory/lap2.md §5).

    Worst case is a 1-D shift of C (L1 ball); ``noise_multiplier = b / C``.  Exact binomial
    expansion of the add direction = Zhu & Wang (2019)'s tight form, which holds for Laplace.
    Integer orders only (+inf elsewhere): the expansion indexes the moments by the order.
    """

    def compute(ints: np.ndarray) -> np.ndarray:
        base = laplace_base_log_moments(noise_multiplier, int(ints.max()))
        return log_moment_add_direction(q, ints, base) / (ints - 1)

    return on_integer_orders(orders, compute)
