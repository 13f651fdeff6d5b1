"""Dirichlet mechanism (Ponnoprat 2023) under Poisson subsampling; docs/theory/dirichlet.md §1-3.

Mechanism: p~ ~ Dir(r s + alpha 1_d) for a softmax vector s; labels public, inputs private.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from scipy.special import gammaln, polygamma

from dpnoise.accounting.rdp.curve import monotone_envelope
from dpnoise.accounting.rdp.orders import on_integer_orders
from dpnoise.accounting.rdp.subsampling import (
    log_moment_add_direction,
    log_moment_shared_inclusion,
    log_moment_zhu_wang_general,
)

DirichletBase = Literal["ponnoprat", "exact-vertex"]
DirichletSubsampling = Literal["replace-one", "general", "tight"]


def dirichlet_max_order(r: float, alpha: float) -> float:
    """Orders must satisfy a < 1 + alpha / r (the Dirichlet parameters stay positive)."""
    return 1.0 + alpha / r


def ponnoprat_rdp(r: float, alpha: float, orders: np.ndarray) -> np.ndarray:
    """eps_P(a) = a r^2 psi'(alpha - (a-1) r)  for 1 < a < 1 + alpha/r, +inf beyond.

    Ponnoprat (TMLR 2023) RDP bound with Delta_2^2 = 2, Delta_inf = 1 (docs/theory/dirichlet.md §1.1).
    """
    a = np.asarray(orders, dtype=float)
    ok = a < dirichlet_max_order(r, alpha)
    arg = np.where(ok, alpha - (a - 1) * r, 1.0)
    with np.errstate(over="ignore"):  # r^2 beyond double range: +inf, still an upper bound
        return np.where(ok, a * np.float64(r) ** 2 * polygamma(1, arg), np.inf)


def exact_vertex_rdp(r: float, alpha: float, orders: np.ndarray) -> np.ndarray:
    """Worst case over two distinct simplex vertices, proven for integer orders (docs/theory/dirichlet.md Sec. 1.2).

    eps(a) = [lnG(alpha + a r) + lnG(alpha - (a-1) r) - lnG(alpha + r) - lnG(alpha)] / (a - 1).
    The four log-Gamma values nearly cancel for small r, so the sum is raised by a bound on its
    rounding error (8 ulp of each term) and capped by Ponnoprat's bound, which is never below it
    and has no cancellation: the result stays an upper bound at every r.
    """
    a = np.asarray(orders, dtype=float)
    ok = a < dirichlet_max_order(r, alpha)
    arg = np.where(ok, alpha - (a - 1) * r, 1.0)
    terms = np.stack([gammaln(alpha + a * r), gammaln(arg), -gammaln(alpha + r) * np.ones_like(a), -gammaln(alpha) * np.ones_like(a)])
    rounding = 8 * np.finfo(float).eps * np.abs(terms).sum(axis=0)
    value = np.maximum(terms.sum(axis=0) + rounding, 0.0) / np.where(ok, a - 1, 1.0)
    return np.where(ok, np.minimum(value, ponnoprat_rdp(r, alpha, a)), np.inf)


def sampled_dirichlet_rdp(
    q: float,
    r: float,
    alpha: float,
    orders: np.ndarray,
    base: DirichletBase = "exact-vertex",
    subsampling: DirichletSubsampling = "replace-one",
) -> np.ndarray:
    """RDP of the Poisson-subsampled Dirichlet mechanism at integer orders (+inf elsewhere).

    ``replace-one`` (the default): replace-one adjacency with each sampled example's sample released,
    exact (:func:`~dpnoise.accounting.rdp.subsampling.log_moment_shared_inclusion`).  ``general``:
    Zhu & Wang (2019) Thm 9 for add/remove adjacency, applied to the replace-one base bound as the
    Dirichlet paper's Theorem 10 does; under replace-one adjacency it is below the truth
    (docs/theory/dirichlet.md, pitfall "Reading of Theorem 10").  ``tight``: Zhu & Wang's tight form,
    whose extra condition is also unproven for the Dirichlet mechanism (§2.2).
    """
    base_fn = {"ponnoprat": ponnoprat_rdp, "exact-vertex": exact_vertex_rdp}[base]
    combine = {"replace-one": lambda q_, ints, base: log_moment_shared_inclusion(q_, base[ints.astype(int)]),
               "general": log_moment_zhu_wang_general, "tight": log_moment_add_direction}[subsampling]

    def compute(ints: np.ndarray) -> np.ndarray:
        eta = np.arange(int(ints.max()) + 1, dtype=float)
        base_log_moments = np.zeros_like(eta)
        base_log_moments[2:] = (eta[2:] - 1) * base_fn(r, alpha, eta[2:])
        return combine(q, ints, base_log_moments) / (ints - 1)

    rdp = on_integer_orders(orders, compute)
    # Each order's value is a bound (exact for replace-one), so the running min from the right is too.
    return rdp if subsampling == "tight" else monotone_envelope(orders, rdp)
