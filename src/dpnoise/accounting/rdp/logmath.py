"""Small log-space helpers."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln


def log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) for x >= 0, accurate for tiny and huge x (-inf at x = 0)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        small = np.log(np.expm1(np.minimum(x, 50.0)))
        large = x + np.log1p(-np.exp(-np.maximum(x, 50.0)))
    return np.where(x < 50.0, small, large)


def log_binomial_weights(q: float, orders: np.ndarray) -> np.ndarray:
    """log w[a, eta] = log[C(a, eta) (1-q)^(a-eta) q^eta], eta = 0..max(a); -inf for eta > a.

    The Binomial(a, q) weights of the subsampled moment expansions (Mironov et al. 2019, Eq. (3);
    seed 1, Thm III.2).  ``orders`` must be integers.
    """
    a = np.asarray(orders, dtype=float)[:, None]
    eta = np.arange(int(np.max(orders)) + 1, dtype=float)[None, :]
    valid = eta <= a
    k = np.where(valid, a - eta, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.log(q) if q > 0 else -np.inf
        log_1mq = np.log1p(-q) if q < 1 else -np.inf
        log_comb = gammaln(a + 1) - gammaln(eta + 1) - gammaln(k + 1)
        term_q = np.where(eta > 0, eta * log_q, 0.0)
        term_1mq = np.where(k > 0, k * log_1mq, 0.0)
        out = log_comb + term_q + term_1mq
    return np.where(valid, out, -np.inf)
