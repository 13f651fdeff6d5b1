"""Input checks shared by the accountants: each error names the offending parameter."""

from __future__ import annotations

import math
from numbers import Integral, Real

from dpnoise.errors import DpnoiseError


class InvalidParameterError(DpnoiseError, ValueError):
    """A privacy parameter is outside its domain (the message names it)."""


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
    return v


def check_sample_rate(name: str, value: object) -> float:
    """Poisson sampling probability q in (0, 1]."""
    v = _real(name, value)
    if not 0 < v <= 1:
        raise InvalidParameterError(f"{name} must be in (0, 1], got {value!r}")
    return v


def check_delta(name: str, value: object) -> float:
    """delta in the open interval (0, 1)."""
    v = _real(name, value)
    if not 0 < v < 1:
        raise InvalidParameterError(f"{name} must be in (0, 1), got {value!r}")
    return v


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
