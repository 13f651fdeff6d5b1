"""Sums over the majorization vector x_i = C (sqrt(i) - sqrt(i-1)), i = 1..n, without looping over n.

Lap2 paper, Lemma III.6; docs/theory/lap2.md §2 and §9.  A :class:`MajorizationRule` is a list of points
s_p (real indices, x(s) = C / (sqrt(s) + sqrt(s-1))) and weights w_p such that, for the smooth
summands g(i) = phi(x_i) used here (phi increasing, so g decreasing in i),

* ``mode="upper"``:    sum_{i=1}^n g(i) <= sum_p w_p g(s_p)  (rigorous, see below);
* ``mode="accurate"``: sum_{i=1}^n g(i) = sum_p w_p g(s_p) to about 1e-13 relative.

The first ``EXACT_HEAD`` = 32 terms (all of them when there are at most 2 EXACT_HEAD) are summed
one by one.  Further terms i = a..m (a = EXACT_HEAD + 1) are summed by the Euler-Maclaurin
midpoint rule with three corrections,

    sum_{i=a}^{m} g(i) = int_{a-1/2}^{m+1/2} g  +  sum_{k=1}^{3} B_2k(1/2)/(2k)! [g^(2k-1)]_{a-1/2}^{m+1/2}  +  E
                       = int - [g']/24 + 7 [g''']/5760 - 31 [g^(5)]/967680 + E,

the derivatives by central differences on s +- h, +-2h, +-3h (h = 1/4; exact for polynomials of
degree 6), the integral by composite Gauss-Legendre in u = log s (panels of width <= 2, 12 nodes
each).  The summands are analytic in u in a strip of half-width > 2.7 about the real axis (x(s)/b
meets the complex zeros of the Laplace moment F only at |Im u| >= 2.7), which puts the quadrature
error near 1e-18 relative; g is analytic in s off (-inf, 1], so g^(k)(s) ~ k! g(s) / s^k, and at
a = 33 the remainder E and the difference errors are ~1e-14 of the block's sum.  Measured against
term-by-term sums (every eta <= 256, b/C from 0.005 to 3000, blocks 33..65 to 33..1000): at most
1.3e-14 relative to the block; the paper's summand (lap2-paper, q up to 0.99): 6e-15 of the sum.

* ``upper``: the terms up to ``head`` (1000) are the sum (one by one up to EXACT_HEAD, then
  Euler-Maclaurin as above, its weights inflated by 1e-12 relative: ~100 times its error); the
  tail i > head is bounded by the integral, since g is decreasing: sum_{i=K+1}^n g(i) <=
  int_K^n g(s) ds (same quadrature), its weights inflated by 1e-9 relative, far above the
  quadrature error.  Both parts approximate non-negative sums to well within their inflation, so
  the rule stays an upper bound for non-negative g.
* ``accurate``: Euler-Maclaurin (as above) from EXACT_HEAD + 1 to n, no inflation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

HEAD = 1000
EXACT_HEAD = 32
_PANEL_WIDTH = 2.0
_NODES_PER_PANEL = 12
_UPPER_SAFETY = 1e-9  # on the integral bound of the tail i > HEAD
_SUM_SAFETY = 1e-12  # on the Euler-Maclaurin part of the sum i <= HEAD
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
        """sum_p w_p values[p, ...] (einsum's own loop: no multi-threaded BLAS call, see
        :func:`dpnoise.accounting.rdp.logmath.matmul_blocked`)."""
        return np.einsum("p,p...->...", self.weights, values)


@lru_cache(maxsize=4)
def _legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(nodes)
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def _gauss_legendre_log(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes/weights for int_lo^hi f(s) ds via u = log s, composite Gauss-Legendre."""
    u_lo, u_hi = np.log(lo), np.log(hi)
    panels = max(1, int(np.ceil((u_hi - u_lo) / _PANEL_WIDTH)))
    edges = np.linspace(u_lo, u_hi, panels + 1)
    x, w = _legendre(_NODES_PER_PANEL)
    half = (edges[1:] - edges[:-1])[:, None] / 2
    mid = (edges[1:] + edges[:-1])[:, None] / 2
    u = (mid + half * x[None, :]).ravel()
    wu = (half * w[None, :]).ravel()
    s = np.exp(u)
    return s, wu * s


def _euler_maclaurin(first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Points/weights for sum_{i=first}^{last} g(i) (midpoint Euler-Maclaurin, see the module doc)."""
    lo, hi = first - 0.5, last + 0.5
    s, w = _gauss_legendre_log(lo, hi)
    # Sum_k B_2k(1/2) / (2k)! [g^(2k-1)(hi) - g^(2k-1)(lo)], k = 1..3, the derivatives by the
    # central differences sum_j c_j [g(x + j h) - g(x - j h)], j = 1..3 (exact for polynomials of
    # degree 6): g' (45, -9, 1)/(60 h), g''' (-13, 8, -1)/(8 h^3), g^(5) (5, -4, 1)/(2 h^5).
    h = _FD_STEP
    d1 = np.array([45.0, -9.0, 1.0]) / (60 * h)
    d3 = np.array([-13.0, 8.0, -1.0]) / (8 * h**3)
    d5 = np.array([5.0, -4.0, 1.0]) / (2 * h**5)
    c = -d1 / 24 + 7 * d3 / 5760 - 31 * d5 / 967680  # applied to g(x + j h) - g(x - j h)
    offsets = h * np.array([1.0, 2.0, 3.0, -1.0, -2.0, -3.0])
    at_x = np.concatenate([c, -c])  # weights of g(x + offsets) in the bracket's term at x
    points = [s, hi + offsets, lo + offsets]
    weights = [w, at_x, -at_x]
    return np.concatenate(points), np.concatenate(weights)


@lru_cache(maxsize=64)
def majorization_rule(
    n: int, mode: Literal["upper", "accurate"] = "upper", head: int = HEAD
) -> MajorizationRule:
    """The rule for sum_{i=1}^n g(i); exact (weights 1 on i = 1..n) when n <= 2 EXACT_HEAD."""
    if mode not in ("upper", "accurate"):
        raise ValueError(f"mode must be 'upper' or 'accurate', got {mode!r}")
    summed = max(min(n, head), min(n, EXACT_HEAD)) if mode == "upper" else n  # last summed index
    # a short Euler-Maclaurin block would carry its end corrections on few terms: sum those exactly
    k0 = summed if summed <= 2 * EXACT_HEAD else EXACT_HEAD
    points = [np.arange(1, k0 + 1, dtype=float)]
    weights = [np.ones(k0)]
    if summed > k0:
        s, w = _euler_maclaurin(k0 + 1, summed)
        points.append(s)
        weights.append(w * (1.0 + _SUM_SAFETY) if mode == "upper" else w)
    if mode == "upper" and n > summed:
        s, w = _gauss_legendre_log(float(summed), float(n))
        points.append(s)
        weights.append(w * (1.0 + _UPPER_SAFETY))
    rule = MajorizationRule(np.concatenate(points), np.concatenate(weights))
    rule.points.setflags(write=False)
    rule.weights.setflags(write=False)
    return rule
