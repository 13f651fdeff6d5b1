"""Sanity checks on every RDP curve before it becomes an epsilon.

A Renyi divergence D_a is >= 0 and non-decreasing in the order a (van Erven & Harremoes 2014,
"Renyi divergence and Kullback-Leibler divergence", arXiv 1206.2459, Thm 3).  A computed curve
that is NaN, negative, or decreasing between two orders where it is finite is a numerical or
logical failure (e.g. a formula evaluated outside its domain), and an epsilon derived from it
could be below the truth; such a curve raises instead of being converted.  +inf means "no bound
at this order" and is always allowed.
"""

from __future__ import annotations

import numpy as np

from dpnoise.errors import DpnoiseError

#: Relative slack for rounding (values of unrelated formulas at neighbouring orders).
_RELATIVE_TOLERANCE = 1e-9
_ABSOLUTE_TOLERANCE = 1e-12


class InvalidPrivacyCurveError(DpnoiseError, ArithmeticError):
    """An accounting computation produced a curve that no valid bound can have; no epsilon is given."""


def checked_rdp_curve(orders: np.ndarray, rdp: np.ndarray, source: str) -> np.ndarray:
    """``rdp`` with rounding-level negatives set to 0, after checking it is a possible RDP curve.

    Raises :class:`InvalidPrivacyCurveError` (naming ``source`` and the orders involved) on NaN,
    a negative value, or a decrease between two orders where the curve is finite.
    """
    orders = np.asarray(orders, dtype=float)
    rdp = np.asarray(rdp, dtype=float)
    if np.isnan(rdp).any():
        bad = orders[np.isnan(rdp)]
        raise InvalidPrivacyCurveError(f"{source}: RDP is NaN at order(s) {bad[:5].tolist()}; refusing to report an epsilon")
    if (rdp < -_ABSOLUTE_TOLERANCE).any():
        k = int(np.argmin(rdp))
        raise InvalidPrivacyCurveError(f"{source}: RDP {rdp[k]:.3g} < 0 at order {orders[k]:g}; refusing to report an epsilon")
    rdp = np.maximum(rdp, 0.0)
    order_index = np.argsort(orders, kind="stable")
    finite = order_index[np.isfinite(rdp[order_index])]
    values = rdp[finite]
    running_max = np.maximum.accumulate(values)
    drop = running_max - values > _RELATIVE_TOLERANCE * running_max + _ABSOLUTE_TOLERANCE
    if drop.any():
        k = int(np.argmax(drop))
        earlier = int(np.argmax(values[: k + 1]))
        raise InvalidPrivacyCurveError(
            f"{source}: RDP decreases from {values[earlier]:.6g} at order {orders[finite[earlier]]:g} to "
            f"{values[k]:.6g} at order {orders[finite[k]]:g}, which no Renyi divergence does; "
            "refusing to report an epsilon"
        )
    return rdp


def monotone_envelope(orders: np.ndarray, rdp_bound: np.ndarray) -> np.ndarray:
    """min_{a' >= a} U(a') for an upper-bound curve U given at ``orders`` (any order).

    Valid whenever every U(a) is itself a proven upper bound on D_a: D is non-decreasing, so
    D_a <= D_a' <= U(a') for all a' >= a.  Bounds such as Zhu & Wang's general subsampling bound
    (factor 3) are not monotone in the order; their envelope is, and is at least as tight.
    """
    orders = np.asarray(orders, dtype=float)
    order_index = np.argsort(orders, kind="stable")
    envelope = np.minimum.accumulate(np.asarray(rdp_bound, dtype=float)[order_index][::-1])[::-1]
    out = np.empty_like(envelope)
    out[order_index] = envelope
    return out
