"""Numbers printed as text, rounded in a chosen direction (imports nothing).

A calibrated noise printed rounded to nearest can land on the unsafe side of the calibration: a
noise multiplier printed 1.18547 for 1.185465... gives more than the target epsilon when it is fed
back.  :func:`significant_digits` rounds toward the safe side instead: a printed value that is
parsed back is never on the other side of the value it stands for.  :func:`decimals` does the same at a
fixed number of decimals, for epsilons: an upper bound printed rounded up, a lower bound rounded down.
"""

from __future__ import annotations

import decimal
import math
from typing import Literal

#: "up": toward +infinity (the printed value is >= the value); "down": toward -infinity
Direction = Literal["up", "down"]
_ROUNDING = {"up": decimal.ROUND_CEILING, "down": decimal.ROUND_FLOOR}


def _parses_back_on_side(text: str, value: float, direction: Direction) -> bool:
    """Whether ``float(text)`` is >= ``value`` ("up") or <= ``value`` ("down"); infinities and NaN always are."""
    if not math.isfinite(value):
        return True
    return float(text) >= value if direction == "up" else float(text) <= value


def significant_digits(value: float, digits: int, direction: Direction) -> str:
    """``value`` to ``digits`` significant digits, written as ``format(x, ".{digits}g")`` writes them,
    such that ``float`` of the text is >= ``value`` (``direction`` "up") or <= ``value`` ("down").

    The text is the nearest rounding where that parses back on the chosen side (0.001 stays
    "0.001", although the float 0.001 is slightly above one thousandth), else the exact decimal
    expansion of the float rounded toward that side; a decimal of at most ``digits`` <= 15
    significant digits survives the trip through a float.  Infinities and NaN print as they are.
    """
    if not 1 <= digits <= 15:
        raise ValueError(f"digits must be in [1, 15], got {digits!r}")
    nearest = format(value, f".{digits}g")
    if _parses_back_on_side(nearest, value, direction):
        return nearest
    exact = decimal.Decimal(value)
    quantum = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(quantum, rounding=_ROUNDING[direction])
    return format(float(rounded), f".{digits}g")


def decimals(value: float, places: int, direction: Direction) -> str:
    """``value`` with ``places`` decimals, written as ``format(x, ".{places}f")`` writes it, such that
    ``float`` of the text is >= ``value`` (``direction`` "up") or <= ``value`` ("down").

    An upper bound on epsilon printed rounded to nearest can read up to half a unit of the last
    decimal below the bound; rounded up it never does.  The text is the nearest rounding where that
    parses back on the chosen side (1.0 stays "1.0000", 0.1 stays "0.1000"), else the exact decimal
    expansion of the float rounded toward that side (0.12341 -> "0.1235" up); the float nearest to a
    decimal above ``value`` is not below it, so the text parses back on the chosen side.  Infinities
    and NaN print as they are.
    """
    if not 0 <= places <= 20:
        raise ValueError(f"places must be in [0, 20], got {places!r}")
    nearest = format(value, f".{places}f")
    if _parses_back_on_side(nearest, value, direction):
        return nearest
    exact = decimal.Decimal(value)
    # enough precision for every digit of the integer part and the kept decimals (quantize never rounds them)
    context = decimal.Context(prec=max(exact.adjusted(), 0) + places + 2)
    rounded = exact.quantize(decimal.Decimal(1).scaleb(-places), rounding=_ROUNDING[direction], context=context)
    return format(rounded, f".{places}f")
