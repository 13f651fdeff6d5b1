"""Default grids of Renyi orders."""

from typing import Callable

import numpy as np

MAX_ORDER = 256
#: Integer orders 2..256: every formula in this package holds at integer orders.
INTEGER_ORDERS: np.ndarray = np.arange(2, MAX_ORDER + 1, dtype=float)
#: Integer orders plus fractional orders in (1, 11) (used where a formula allows them, e.g. the
#: sampled Gaussian); other mechanisms report +inf at fractional orders, which the conversion skips.
DEFAULT_ORDERS: np.ndarray = np.union1d(
    np.round(np.arange(1.1, 11.0, 0.1), 10), INTEGER_ORDERS
)


def integer_mask(orders: np.ndarray) -> np.ndarray:
    """True where an order is an integer >= 2."""
    orders = np.asarray(orders, dtype=float)
    return (orders == np.round(orders)) & (orders >= 2)


def on_integer_orders(orders: np.ndarray, compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``compute(integer orders)`` at the integer orders >= 2 of ``orders``, +inf at the others.

    For bounds proven (or formulas valid) at integer orders only: +inf means "no bound at this
    order", which the RDP -> (epsilon, delta) conversion skips.
    """
    orders = np.asarray(orders, dtype=float)
    out = np.full(orders.shape, np.inf)
    ints = integer_mask(orders)
    if ints.any():
        out[ints] = compute(orders[ints])
    return out
