"""Sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019, "Renyi DP of the Sampled Gaussian Mechanism")."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, log_ndtr

from dpnoise.accounting.rdp.orders import integer_mask
from dpnoise.accounting.rdp.subsampling import log_moment_add_direction, log_moment_shared_inclusion

#: Outside [FRACTIONAL_MIN_NOISE, FRACTIONAL_MAX_NOISE] the fractional-order series cancels
#: catastrophically (small sigma: terms of size i^2 / (2 sigma^2) with opposite signs; large sigma:
#: terms of size 1 summing to 1 + RDP with RDP ~ q^2 / sigma^2 below rounding); fractional orders
#: then get +inf (no bound), integer orders stay exact.
FRACTIONAL_MIN_NOISE = 0.1
FRACTIONAL_MAX_NOISE = 30.0


def inverse_two_sigma_squared(noise_multiplier: float) -> float:
    """1 / (2 sigma^2) in log space: +inf when it overflows (sigma below ~1e-154), 0 for huge sigma."""
    return float(np.exp(min(-2.0 * np.log(noise_multiplier) - np.log(2.0), 710.0)))


def gaussian_base_log_moments(noise_multiplier: float, max_order: int) -> np.ndarray:
    """R(eta) = eta (eta - 1) / (2 sigma^2) = log E[(N(1,s^2)/N(0,s^2))^eta] (sensitivity 1).

    R(0) = R(1) = 0 exactly, +inf for eta >= 2 when 1/(2 sigma^2) overflows.
    """
    eta = np.arange(max_order + 1, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):  # inf * 0 at eta < 2 is discarded
        return np.where(eta >= 2, eta * (eta - 1) * inverse_two_sigma_squared(noise_multiplier), 0.0)


#: Terms of the alternating tail given to the Cohen-Rodriguez Villegas-Zagier acceleration:
#: relative error <= 2 / (3 + sqrt 8)^30 < 1e-22 of the tail.
_TAIL_TERMS = 30


def _crvz_weights(n: int) -> np.ndarray:
    """w_k with sum_k w_k a_k = sum_{k>=0} (-1)^k a_k up to 2 (3+sqrt 8)^-n relative error.

    Cohen, Rodriguez Villegas, Zagier (2000), "Convergence acceleration of alternating series",
    Algorithm 1; the bound (their Prop. 1) holds whenever a_k = int_0^1 x^k dmu(x), mu >= 0.
    The signs of the alternation are included in the weights.
    """
    d = (3.0 + np.sqrt(8.0)) ** n
    d = (d + 1.0 / d) / 2.0
    b, c = -1.0, -d
    weights = np.empty(n)
    for k in range(n):
        c = b - c
        weights[k] = c / d
        b = (k + n) * (k - n) * b / ((k + 0.5) * (k + 1.0))
    return weights


_CRVZ_WEIGHTS = _crvz_weights(_TAIL_TERMS)


def _log_a_fractional_orders(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log A_a at each fractional order a > 1: the two-sided series of Mironov et al. (2019), Sec. 3.3.

    A_a = sum_i C(a,i) q^i (1-q)^(a-i) e^{(i^2-i)/(2s^2)} Phi((z0 - i)/s)
        + sum_i C(a,i) q^(a-i) (1-q)^i e^{((a-i)^2-(a-i))/(2s^2)} Phi((a - i - z0)/s),
    z0 = s^2 log(1/q - 1) + 1/2; generalised binomials C(a, i) change sign for i > a.

    Terms i <= floor(a) are positive and summed as they are.  For i = floor(a) + 1 + k the i-th
    pair equals (-1)^k K |C(a, i)| [R((i - z0)/s) + R((i - a + z0)/s)], with K > 0 independent of
    i and R the Mills ratio Phi(-y)/phi(y) = int_0^inf e^{-yt - t^2/2} dt.  Both |C(a, i)|
    (a Beta integral, by reflection) and R((i - c)/s) are moment sequences in k, hence so is their
    product: the alternating tail is summed by the Cohen-Rodriguez Villegas-Zagier acceleration
    with ``_TAIL_TERMS`` terms (relative error below 1e-22 of the tail), where the plain series
    needs thousands of terms at small orders (its terms decay only like i^(-a-2)).
    """
    a = np.asarray(orders, dtype=float)[:, None]
    with np.errstate(over="ignore"):
        z0 = float(np.float64(sigma) ** 2 * np.log(1.0 / q - 1.0)) + 0.5
    inv = inverse_two_sigma_squared(sigma)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    floor_a = np.floor(a)
    head_len = int(floor_a.max()) + 1
    i = np.concatenate(
        [np.broadcast_to(np.arange(head_len, dtype=float), (a.shape[0], head_len)),
         floor_a + 1.0 + np.arange(_TAIL_TERMS, dtype=float)[None, :]],
        axis=1,
    )
    j = a - i
    log_comb = gammaln(a + 1) - gammaln(i + 1) - gammaln(j + 1)
    with np.errstate(over="ignore", invalid="ignore"):
        t0 = log_comb + i * log_q + j * log_1mq + (i * i - i) * inv + log_ndtr((z0 - i) / sigma)
        t1 = log_comb + j * log_q + i * log_1mq + (j * j - j) * inv + log_ndtr((j - z0) / sigma)
    weights = np.concatenate(
        [np.where(np.arange(head_len)[None, :] <= floor_a, 1.0, 0.0),  # padding of short heads: 0
         np.broadcast_to(_CRVZ_WEIGHTS, (a.shape[0], _TAIL_TERMS))],
        axis=1,
    )
    log_terms = np.concatenate([t0, t1], axis=1)
    signed = np.concatenate([weights, weights], axis=1)
    log_terms[signed == 0] = -np.inf
    # signed log-sum-exp; the largest term is taken out and the rest enters through log1p, so that
    # A = 1 + (tiny RDP) keeps its digits (as scipy.special.logsumexp does)
    rows = np.arange(log_terms.shape[0])
    top = np.argmax(log_terms, axis=1)
    peak = log_terms[rows, top]
    finite_peak = np.where(np.isfinite(peak), peak, 0.0)
    top_weight = signed[rows, top]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = signed * np.exp(log_terms - finite_peak[:, None])
        scaled[rows, top] = 0.0
        ratio = scaled.sum(axis=1) / top_weight  # (sum) = top_weight (1 + ratio)
        value = finite_peak + np.log(np.abs(top_weight)) + np.where(
            ratio > -1.0, np.log1p(ratio), np.log(np.abs(1.0 + ratio))
        )
    sign = np.sign(top_weight) * np.sign(1.0 + ratio)
    # A_a >= 1 exactly; rounding can leave it a hair below when the RDP is ~1e-16: clamp up.
    # Anything further below is a failed evaluation: no bound (+inf), never a small number.
    failed = (sign <= 0) | (value < -1e-10)
    return np.where(failed, np.inf, np.maximum(value, 0.0))


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    """log A_a for one fractional order a (see :func:`_log_a_fractional_orders`)."""
    return float(_log_a_fractional_orders(q, sigma, np.array([float(order)]))[0])


def sampled_gaussian_rdp(q: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP D_a of the Poisson-sampled Gaussian mechanism with noise std ``noise_multiplier * C``.

    Integer orders: exact binomial expansion (Mironov et al. 2019, Sec. 3.3, Eq. (3)); fractional
    orders: their two-sided series, for sigma in [``FRACTIONAL_MIN_NOISE``, ``FRACTIONAL_MAX_NOISE``] (+inf outside).
    Equal to Opacus / dp_accounting's RDP for this mechanism.
    """
    orders = np.asarray(orders, dtype=float)
    ints = integer_mask(orders)
    out = np.full(orders.shape, np.inf)
    if q == 1.0:
        with np.errstate(over="ignore"):
            return orders * inverse_two_sigma_squared(noise_multiplier)
    if ints.any():
        base = gaussian_base_log_moments(noise_multiplier, int(orders[ints].max()))
        out[ints] = log_moment_add_direction(q, orders[ints], base) / (orders[ints] - 1)
    if FRACTIONAL_MIN_NOISE <= noise_multiplier <= FRACTIONAL_MAX_NOISE:
        fractional = np.flatnonzero(~ints)
        if fractional.size:
            log_a = _log_a_fractional_orders(q, noise_multiplier, orders[fractional])
            out[fractional] = log_a / (orders[fractional] - 1)
    return out


def shared_inclusion_gaussian_rdp(q: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP of a Gaussian output released for each sampled example, under replace-one adjacency.

    Each sampled example's (clipped) output gets its own Gaussian noise and is released with it (the
    penultimate-layer baseline, docs/theory/dirichlet.md Sec. 6): the base pair is N(0, s^2) vs
    N(1, s^2) at sensitivity 1 (R(a) = a (a-1) / (2 s^2)), and the changed example's release is
    there exactly in the steps that sample it
    (:func:`~dpnoise.accounting.rdp.subsampling.log_moment_shared_inclusion`); exact at every order.
    """
    a = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore"):
        base = a * (a - 1) * inverse_two_sigma_squared(noise_multiplier)
    return log_moment_shared_inclusion(q, base) / (a - 1)
