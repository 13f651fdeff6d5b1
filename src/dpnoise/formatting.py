"""Numbers printed as text, rounded in a chosen direction (imports nothing).

A calibrated noise printed rounded to nearest can land on the unsafe side of the calibration: a
noise multiplier printed 1.18547 for 1.185465... gives more than the target epsilon when it is fed
back.  :func:`significant_digits` rounds toward the safe side instead: a printed value that is
parsed back is never on the other side of the value it stands for.
"""

from __future__ import annotations

import decimal
import math
from typing import Literal

#: "up": toward +infinity (the printed value is >= the value); "down": toward -infinity
Direction = Literal["up", "down"]
_ROUNDING = {"up": decimal.ROUND_CEILING, "down": decimal.ROUND_FLOOR}


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
    if not math.isfinite(value) or (float(nearest) >= value if direction == "up" else float(nearest) <= value):
        return nearest
    exact = decimal.Decimal(value)
    quantum = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(quantum, rounding=_ROUNDING[direction])
    return format(float(rounded), f".{digits}g")
