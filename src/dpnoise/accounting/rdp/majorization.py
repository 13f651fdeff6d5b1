"""Sums over the majorization vector x_i = C (sqrt(i) - sqrt(i-1)), i = 1..n, without looping over n.

Seed 1, Lemma III.6; spec lap2.md §2 and §9.  A :class:`MajorizationRule` is a list of points
s_p (real indices, x(s) = C / (sqrt(s) + sqrt(s-1))) and weights w_p such that, for the smooth
summands g(i) = phi(x_i) used here (phi increasing, so g decreasing in i),

* ``mode="upper"``:    sum_{i=1}^n g(i) <= sum_p w_p g(s_p)  (rigorous, see below);
* ``mode="accurate"``: sum_{i=1}^n g(i) = sum_p w_p g(s_p) to about 1e-12 relative.

The first ``head`` terms are summed exactly.  Tail, upper mode: g decreasing gives
sum_{i=K+1}^n g(i) <= int_K^n g(s) ds, integrated by composite Gauss-Legendre in u = log s
(panels of width <= 0.25, 20 nodes each: the integrand is analytic and near-constant, so the
quadrature error is below 1e-13 relative); the tail weights are then inflated by 1e-9 relative,
far above that error, so the result stays an upper bound for non-negative g.
Tail, accurate mode: Euler-Maclaurin midpoint rule
sum_{i=K+1}^n g(i) = int_{K+1/2}^{n+1/2} g - [g'(n+1/2) - g'(K+1/2)]/24 + O(g'''), with g' by a
central difference (the derivative term is a linear functional, so it is folded into the weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

HEAD = 1000
_PANEL_WIDTH = 0.25
_NODES_PER_PANEL = 20
_UPPER_SAFETY = 1e-9
_FD_STEP = 0.25


@dataclass(frozen=True)
class MajorizationRule:
    """Points (real indices s >= 1) and weights approximating or bounding sum_{i<=n} g(i)."""

    points: np.ndarray
    weights: np.ndarray

    def shifts(self, scale: float) -> np.ndarray:
        """x(s_p) * scale: the majorization coordinates (e.g. scale = C / b gives t = x / b)."""
        s = self.points
        return scale / (np.sqrt(s) + np.sqrt(s - 1.0))

    def apply(self, values: np.ndarray) -> np.ndarray:
        """sum_p w_p values[p, ...]."""
        return np.tensordot(self.weights, values, axes=(0, 0))


def _gauss_legendre_log(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes/weights for int_lo^hi f(s) ds via u = log s, composite Gauss-Legendre."""
    u_lo, u_hi = np.log(lo), np.log(hi)
    panels = max(1, int(np.ceil((u_hi - u_lo) / _PANEL_WIDTH)))
    edges = np.linspace(u_lo, u_hi, panels + 1)
    x, w = np.polynomial.legendre.leggauss(_NODES_PER_PANEL)
    half = (edges[1:] - edges[:-1])[:, None] / 2
    mid = (edges[1:] + edges[:-1])[:, None] / 2
    u = (mid + half * x[None, :]).ravel()
    wu = (half * w[None, :]).ravel()
    s = np.exp(u)
    return s, wu * s


@lru_cache(maxsize=64)
def majorization_rule(
    n: int, mode: Literal["upper", "accurate"] = "upper", head: int = HEAD
) -> MajorizationRule:
    """The rule for sum_{i=1}^n g(i); exact (weights 1 on i = 1..n) when n <= head."""
    k = min(n, head)
    points = [np.arange(1, k + 1, dtype=float)]
    weights = [np.ones(k)]
    if n > k:
        if mode == "upper":
            s, w = _gauss_legendre_log(float(k), float(n))
            w = w * (1.0 + _UPPER_SAFETY)
            points.append(s)
            weights.append(w)
        elif mode == "accurate":
            lo, hi = k + 0.5, n + 0.5
            s, w = _gauss_legendre_log(lo, hi)
            h = _FD_STEP
            fd_points = np.array([hi + h, hi - h, lo + h, lo - h])
            fd_weights = np.array([-1.0, 1.0, 1.0, -1.0]) / (24.0 * 2.0 * h)
            points += [s, fd_points]
            weights += [w, fd_weights]
        else:
            raise ValueError(f"mode must be 'upper' or 'accurate', got {mode!r}")
    return MajorizationRule(np.concatenate(points), np.concatenate(weights))
