"""Gaussian differential privacy of the Laplace mechanism, and of one Lap2 step.

Dong, Roth & Su, "Gaussian differential privacy" (arXiv 1905.02383): mu-GDP means the tradeoff
function is at least G_mu, the one of N(0, 1) vs N(mu, 1); GDP tensorises as
G_mu1 (x) G_mu2 = G_sqrt(mu1^2 + mu2^2) (their Sec. 3).  Derivation: docs/theory/lap2.md, Sec. 10.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtri_exp

#: sqrt(pi/2): the Lipschitz constant of Phi^{-1} o F_Laplace, the best per-unit-shift GDP constant.
SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
# Below this shift the exact mu*(a) equals sqrt(pi/2) a to ~1e-7 relative; use the bound itself.
_SMALL_SHIFT = 1e-3
# Relative inflation of the exact mu*(a) so that rounding can never make it an under-estimate.
_ROUNDING_SLACK = 1e-12


def laplace_shift_gdp_mu(shift: np.ndarray) -> np.ndarray:
    """mu*(a) = 2 Phi^{-1}(1 - e^{-a/2} / 2): Lap(0, 1) vs Lap(a, 1) is mu*(a)-GDP (exact).

    Lemma of docs/theory/lap2.md Sec. 10 (Dong, Roth & Su, arXiv 1905.02383, tradeoff functions of
    location families).  Evaluated as -2 Phi^{-1}(e^{-a/2 - log 2}) with ``ndtri_exp`` (log space,
    no cancellation for large a), never above sqrt(pi/2) a.
    """
    a = np.asarray(shift, dtype=float)
    exact = -2.0 * ndtri_exp(-a / 2.0 - math.log(2.0)) * (1.0 + _ROUNDING_SLACK)
    linear = SQRT_HALF_PI * a
    return np.where(a < _SMALL_SHIFT, linear, np.minimum(exact, linear))


def lap2_gdp_mu(noise_multiplier: float, num_params: int) -> float:
    """M_n: one Lap2 step (L2 sensitivity C, i.i.d. Lap(b) on n coordinates) is M_n-GDP.

    M_n = sqrt(n) mu*(C / (b sqrt(n))) < sqrt(pi/2) C / b, with ``noise_multiplier = b / C``
    (docs/theory/lap2.md Sec. 10, consequence 1: mu*(sqrt(s))^2 is concave, so the worst shift
    of L2 norm C spreads evenly over the n coordinates).
    """
    root_n = math.sqrt(num_params)
    return float(root_n * laplace_shift_gdp_mu(1.0 / (noise_multiplier * root_n)))
