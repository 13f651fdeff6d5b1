"""Input checks shared by the accountants: each error names the offending parameter.

A bool is never a number here (``True`` is not taken as 1): every check refuses it.
"""

from __future__ import annotations

import math
import reprlib
import sys
from numbers import Integral, Real

import numpy as np

from dpnoise.errors import DpnoiseError


class InvalidParameterError(DpnoiseError, ValueError):
    """A privacy parameter is outside its domain (the message names it)."""


#: the magnitudes the accountants compute with: a noise (per clip where the privacy depends on noise / clip)
#: or a Dirichlet offset outside them overflows or underflows their arithmetic
ACCOUNTED_RANGE = (1e-300, 1e300)


def _normal(name: str, value: float, given: object) -> float:
    """``value`` (> 0), refused when subnormal: below the smallest normal float, where quotients overflow and
    the value itself has lost precision."""
    if value < sys.float_info.min:
        raise InvalidParameterError(f"{name} must be at least {sys.float_info.min:g} (the smallest normal float), "
                                    f"got {given!r}")
    return value


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise InvalidParameterError(f"{name} must not be NaN")
    return value


def check_positive(name: str, value: object) -> float:
    """Finite and > 0 (noise scales, clipping norms, epsilons, Dirichlet r and alpha)."""
    v = _real(name, value)
    if not (v > 0 and math.isfinite(v)):
        raise InvalidParameterError(f"{name} must be finite and > 0, got {value!r}")
    return _normal(name, v, value)


def check_accounted(name: str, value: object, limits: tuple[float, float] = ACCOUNTED_RANGE) -> float:
    """Finite, > 0 and within ``limits`` (a noise in an accountant's unit, a Dirichlet offset)."""
    v = _real(name, value)
    low, high = limits
    if v > 0 and math.isfinite(v) and not low <= v <= high:
        raise InvalidParameterError(f"{name} must be between {low:g} and {high:g} (beyond, the accountants' "
                                    f"arithmetic overflows), got {v:g}")
    return check_positive(name, value)


def check_noise_per_clip(noise_name: str, noise: object, clip_name: str, clip: object,
                         limits: tuple[float, float] = ACCOUNTED_RANGE) -> float:
    """``noise / clip`` (a Laplace b / C, what the privacy depends on), after checking both, and the ratio
    within ``limits``; the errors name them ``noise_name`` and ``clip_name``."""
    b, c = check_positive(noise_name, noise), check_positive(clip_name, clip)
    return check_accounted(f"{noise_name} / {clip_name} ({b:g} / {c:g})", b / c, limits)


def check_sample_rate(name: str, value: object) -> float:
    """Poisson sampling probability q in (0, 1]."""
    v = _real(name, value)
    if not 0 < v <= 1:
        raise InvalidParameterError(f"{name} must be in (0, 1], got {value!r}")
    return _normal(name, v, value)


def check_delta(name: str, value: object) -> float:
    """delta in the open interval (0, 1)."""
    v = _real(name, value)
    if not 0 < v < 1:
        raise InvalidParameterError(f"{name} must be in (0, 1), got {value!r}")
    return _normal(name, v, value)


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """An integer count >= minimum (steps, parameters); integral floats like 1e9 are accepted."""
    if isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, Integral):
        v = _real(name, value)
        if not (math.isfinite(v) and v == int(v)):
            raise InvalidParameterError(f"{name} must be an integer, got {value!r}")
        value = int(v)
    if value < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_orders(name: str, value: object) -> np.ndarray:
    """Renyi orders: a non-empty one-dimensional sequence of finite real numbers, each > 1.

    Every order must be > 1 because the RDP -> (epsilon, delta) conversion divides by (order - 1)
    (Balle et al. 2020, arXiv 1905.09982, Thm 21).
    """
    not_orders = InvalidParameterError(
        f"{name} must be a one-dimensional sequence of real numbers, got {reprlib.repr(value)}")
    try:
        orders = np.asarray(value)
    except (TypeError, ValueError):  # ragged nesting
        raise not_orders from None
    if orders.ndim != 1 or orders.dtype.kind not in "iuf" or any(isinstance(v, (bool, np.bool_)) for v in value):
        raise not_orders
    if orders.size == 0:
        raise InvalidParameterError(f"{name} must hold at least one Renyi order, got none")
    orders = orders.astype(float)
    bad = ~(np.isfinite(orders) & (orders > 1))
    if bad.any():
        raise InvalidParameterError(f"{name} must be finite and > 1, got {float(orders[bad][0])!r}")
    return orders
