"""Sampled Gaussian mechanism (Mironov, Talwar, Zhang 2019, "Renyi DP of the Sampled Gaussian Mechanism")."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, gammasgn, log_ndtr, logsumexp

from dpnoise.accounting.rdp.orders import integer_mask
from dpnoise.accounting.rdp.subsampling import log_moment_add_direction

_SERIES_CHUNK = 256


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


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    """log A_a for fractional a: the two-sided series of Mironov et al. (2019), Sec. 3.3.

    A_a = sum_i C(a,i) q^i (1-q)^(a-i) e^{(i^2-i)/(2s^2)} Phi((z0 - i)/s)
        + sum_i C(a,i) q^(a-i) (1-q)^i e^{((a-i)^2-(a-i))/(2s^2)} Phi((a - i - z0)/s),
    z0 = s^2 log(1/q - 1) + 1/2; generalised binomials C(a, i) change sign for i > a.
    """
    with np.errstate(over="ignore"):
        z0 = float(np.float64(sigma) ** 2 * np.log(1.0 / q - 1.0)) + 0.5
    inv = inverse_two_sigma_squared(sigma)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    logs, signs = [], []
    for start in range(0, 100 * _SERIES_CHUNK, _SERIES_CHUNK):
        i = np.arange(start, start + _SERIES_CHUNK, dtype=float)
        j = order - i
        log_comb = gammaln(order + 1) - gammaln(i + 1) - gammaln(j + 1)
        sign = gammasgn(j + 1)
        t0 = log_comb + i * log_q + j * log_1mq + (i * i - i) * inv
        t0 += log_ndtr((z0 - i) / sigma)
        t1 = log_comb + j * log_q + i * log_1mq + (j * j - j) * inv
        t1 += log_ndtr((j - z0) / sigma)
        logs += [t0, t1]
        signs += [sign, sign]
        if start > order and max(t0.max(), t1.max()) < -40:
            break
    value, sign = logsumexp(np.concatenate(logs), b=np.concatenate(signs), return_sign=True)
    # A_a >= 1 exactly; rounding can leave it a hair below when the RDP is ~1e-16: clamp up.
    # Anything further below is a failed evaluation: no bound (+inf), never a small number.
    if sign <= 0 or value < -1e-10:
        return float("inf")
    return max(float(value), 0.0)


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
        for k in np.flatnonzero(~ints):
            out[k] = _log_a_fractional(q, noise_multiplier, float(orders[k])) / (orders[k] - 1)
    return out
