"""RDP -> (epsilon, delta) conversion (Balle, Barthe, Gaboardi, Hsu, Sato 2020, Thm 21).

    eps(delta) = min_a [ D_a + log((a-1)/a) - (log delta + log a)/(a-1) ]

For a = lam + 1 this is the Lap2 paper's form T alpha(lam)/lam + log(lam/(lam+1)) - (log delta + log(lam+1))/lam.
"""

from __future__ import annotations

import numpy as np


def _as_curve(orders: np.ndarray, rdp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    orders = np.atleast_1d(np.asarray(orders, dtype=float))
    rdp = np.atleast_1d(np.asarray(rdp, dtype=float))
    if orders.shape != rdp.shape:
        raise ValueError(f"orders and rdp differ in shape: {orders.shape} vs {rdp.shape}")
    if np.any(orders <= 1):
        raise ValueError("Renyi orders must be > 1")
    if np.any(np.isnan(rdp)) or np.any(rdp < 0):
        raise ValueError("RDP values must be non-negative numbers (got NaN or negative)")
    return orders, rdp


def epsilon_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """(epsilon, optimal order) from an RDP curve; epsilon is clipped at 0 and may be +inf."""
    orders, rdp = _as_curve(orders, rdp)
    with np.errstate(invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / orders) - (np.log(delta) + np.log(orders)) / (orders - 1)
    eps = np.where(np.isfinite(rdp), eps, np.inf)
    best = int(np.argmin(eps))
    return max(float(eps[best]), 0.0), float(orders[best])


def delta_from_rdp(orders: np.ndarray, rdp: np.ndarray, epsilon: float) -> tuple[float, float]:
    """(delta, optimal order): the inverse of :func:`epsilon_from_rdp` (same theorem), capped at 1.

    log delta = (a-1) (D_a - eps + log(1 - 1/a)) - log a.
    """
    orders, rdp = _as_curve(orders, rdp)
    with np.errstate(invalid="ignore"):
        log_delta = (orders - 1) * (rdp - epsilon + np.log1p(-1.0 / orders)) - np.log(orders)
    log_delta = np.where(np.isfinite(rdp), log_delta, np.inf)
    best = int(np.argmin(log_delta))
    return float(min(1.0, np.exp(min(log_delta[best], 0.0)))), float(orders[best])
