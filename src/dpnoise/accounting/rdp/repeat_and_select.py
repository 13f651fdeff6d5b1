"""RDP of running a private mechanism a random number of times and releasing only the best run
(Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022, arXiv 2110.03620).

A tuning job draws the number of trials K at random, runs one private trial per draw (each with its own
hyperparameters, each Q with the same RDP curve eps(a)) and releases the best trial (its model and
score); the other trials are not released.  With K from

* a truncated negative binomial D_{eta, gamma} (eta >= 0; eta = 0 the logarithmic, eta = 1 the
  geometric distribution), Theorem 2: for every a > 1 and a^ >= 1,
  eps'(a) = eps(a) + (1 + eta) (1 - 1/a^) eps(a^) + (1 + eta) log(1/gamma) / a^ + log(E[K]) / (a - 1);
* a Poisson distribution of mean mu, Theorem 6: for every a > 1 with e^{eps^} <= 1 + 1/(a - 1) and
  Q (eps^, delta^)-DP, eps'(a) = eps(a) + mu delta^ + log(mu) / (a - 1).

Both are upper bounds at each order; the curve is then replaced by its monotone envelope (an RDP curve
is non-decreasing in the order).  The bound is never below the single trial's: the added terms are
non-negative for E[K] >= 1.
"""

from __future__ import annotations

import math

import numpy as np

from dpnoise.accounting.rdp.conversion import delta_from_rdp
from dpnoise.accounting.rdp.curve import monotone_envelope
from dpnoise.accounting.validation import InvalidParameterError


def truncated_negative_binomial_mean(shape: float, gamma: float) -> float:
    """E[K] of D_{eta, gamma} (arXiv 2110.03620, Sec. 2): eta (1 - gamma) / (gamma (1 - gamma^eta)), and the
    logarithmic distribution's (1/gamma - 1) / log(1/gamma) at eta = 0."""
    if shape == 0:
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def truncated_negative_binomial_gamma(shape: float, mean: float) -> float:
    """The gamma in (0, 1) of D_{eta, gamma} with E[K] = ``mean`` (> 1; E[K] decreases from infinity to 1 as
    gamma goes from 0 to 1), by Brent's method on log gamma."""
    from scipy.optimize import brentq  # on first use: the accounting commands start without scipy.optimize

    if not mean > 1:
        raise InvalidParameterError(f"mean must be > 1 for a truncated negative binomial number of trials, got {mean!r}")
    log_gamma = brentq(lambda g: math.log(truncated_negative_binomial_mean(shape, math.exp(g))) - math.log(mean),
                       -700.0, -1e-12, xtol=1e-14, rtol=1e-14)
    return math.exp(log_gamma)


def repeat_and_select_rdp(orders: np.ndarray, rdp: np.ndarray, mean: float, shape: float) -> np.ndarray:
    """The RDP curve of releasing the best of K runs of a mechanism with RDP curve ``rdp`` at ``orders``
    (Theorem 2 for ``shape`` eta >= 0, Theorem 6 for ``shape`` = inf, Poisson; module docstring); +inf at
    orders <= 1, where neither theorem applies.  ``mean`` = E[K] >= 1 (a truncated negative binomial of mean 1 is
    K = 1 exactly: the run itself; a Poisson law of mean 1 is not)."""
    orders = np.asarray(orders, dtype=float)
    rdp = np.asarray(rdp, dtype=float)
    if mean == 1 and not math.isinf(shape):  # a truncated negative binomial of mean 1 is K = 1 (Poisson's is not)
        return rdp.copy()
    above_one = orders > 1
    bound = np.full(len(orders), np.inf)
    if math.isinf(shape):
        for i in np.flatnonzero(above_one):
            epsilon_hat = math.log1p(1.0 / (orders[i] - 1.0))
            delta_hat, _ = delta_from_rdp(orders[above_one], rdp[above_one], epsilon_hat)
            bound[i] = rdp[i] + mean * delta_hat + math.log(mean) / (orders[i] - 1.0)
    else:
        gamma = truncated_negative_binomial_gamma(shape, mean)
        usable = orders >= 1
        with np.errstate(invalid="ignore"):
            best_hat = np.nanmin((1.0 - 1.0 / orders[usable]) * rdp[usable] + math.log(1.0 / gamma) / orders[usable])
        bound[above_one] = rdp[above_one] + (1.0 + shape) * best_hat + math.log(mean) / (orders[above_one] - 1.0)
    return monotone_envelope(orders, bound)
