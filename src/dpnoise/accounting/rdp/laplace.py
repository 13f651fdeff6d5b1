"""Laplace moments (seed 1, Thm III.2) and the Laplace mechanism with L1 clipping (spec lap2.md §1, §5)."""

from __future__ import annotations

import numpy as np

from dpnoise.accounting.rdp.orders import on_integer_orders
from dpnoise.accounting.rdp.subsampling import log_moment_add_direction

# Below this eta*t the excess F - 1 is summed from non-negative pieces (no cancellation).
_SMALL = 1.0


def _expm1_minus_x(x: np.ndarray) -> np.ndarray:
    """e^x - 1 - x >= 0, accurate near 0 (Taylor series for |x| < 0.1)."""
    x = np.asarray(x, dtype=float)
    xs = np.where(np.abs(x) < 0.1, x, 0.0)
    series = np.zeros_like(xs)
    for k in range(16, 1, -1):  # Horner on x^2 (1/2! + x/3! + ... )
        series = series * xs / (k + 1) + 1.0
    series = series * xs * xs / 2.0
    with np.errstate(over="ignore"):
        direct = np.expm1(x) - x
    return np.where(np.abs(x) < 0.1, series, direct)


def log_laplace_moment_excess(t: np.ndarray, eta: np.ndarray) -> np.ndarray:
    """log(F(t, eta) - 1), broadcasting over t = u/b >= 0 and integer eta >= 0 (-inf at eta in {0, 1}).

    F(t, eta) = E[(p_u/p_0)^eta] = [eta e^{(eta-1)t} + (eta-1) e^{-eta t}] / (2 eta - 1)
    (spec lap2.md §1).  Since F - 1 = [eta g((eta-1)t) + (eta-1) g(-eta t)]/(2 eta - 1) with
    g(x) = e^x - 1 - x >= 0, small t is computed without cancellation; large t via logaddexp.
    """
    t, eta = np.broadcast_arrays(np.asarray(t, dtype=float), np.asarray(eta, dtype=float))
    trivial = eta <= 1
    e = np.where(trivial, 2.0, eta)
    small = e * t < _SMALL
    ts = np.where(small, t, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess_small = np.log(
            (e * _expm1_minus_x((e - 1) * ts) + (e - 1) * _expm1_minus_x(-e * ts)) / (2 * e - 1)
        )
        log_f = np.logaddexp(np.log(e) + (e - 1) * t, np.log(e - 1) - e * t) - np.log(2 * e - 1)
        excess_large = log_f + np.log(-np.expm1(-log_f))
    return np.where(trivial, -np.inf, np.where(small, excess_small, excess_large))


def log_laplace_moment(t: np.ndarray, eta: np.ndarray) -> np.ndarray:
    """log F(t, eta) (spec lap2.md §1), accurate for all t >= 0."""
    return np.logaddexp(0.0, log_laplace_moment_excess(t, eta))


def laplace_base_log_moments(noise_multiplier: float, max_order: int) -> np.ndarray:
    """R(eta) = log F(1/noise_multiplier, eta): the 1-D Laplace shift of one clipping norm."""
    return log_laplace_moment(1.0 / noise_multiplier, np.arange(max_order + 1))


def sampled_laplace_rdp(q: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the Poisson-sampled Laplace mechanism with L1 clipping (spec lap2.md §5).

    Worst case is a 1-D shift of C (L1 ball); ``noise_multiplier = b / C``.  Exact binomial
    expansion of the add direction = Zhu & Wang (2019)'s tight form, which holds for Laplace.
    Integer orders only (+inf elsewhere): the expansion indexes the moments by the order.
    """

    def compute(ints: np.ndarray) -> np.ndarray:
        base = laplace_base_log_moments(noise_multiplier, int(ints.max()))
        return log_moment_add_direction(q, ints, base) / (ints - 1)

    return on_integer_orders(orders, compute)
