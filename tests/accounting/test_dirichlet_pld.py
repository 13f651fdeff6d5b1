"""Two-class Dirichlet PLD (docs/theory/dirichlet.md Sec. 1.3): domination, pessimism, and agreement with the
exact lower bound."""

import numpy as np
import pytest
from scipy.special import betainc, betaln, expit

from dpnoise.accounting import epsilon_after
from dpnoise.accounting.pld.dirichlet import two_class_vertex_masses, two_class_vertex_pld
from dpnoise.audit.pld import dirichlet_shift_laws, epsilon_lower_bound


def _hockey_stick(r: float, alpha: float, theta: float, theta_other: float, epsilon: np.ndarray) -> np.ndarray:
    """H_{e^eps}(P_theta || P_theta') for P_theta = Beta(alpha + r theta, alpha + r (1 - theta)), by integrating
    (p - e^eps p')_+ on a fine grid of logit(x) (an independent evaluation, no use of monotone likelihood ratios)."""
    t = np.linspace(-200, 200, 400_001)
    log_x, log_1mx, dt = -np.logaddexp(0, -t), -np.logaddexp(0, t), t[1] - t[0]

    def density(th: float) -> np.ndarray:  # density of T = logit(X)
        a, b = alpha + r * th, alpha + r * (1 - th)
        return np.exp(a * log_x + b * log_1mx - betaln(a, b))

    p, p_other = density(theta), density(theta_other)
    return np.array([np.sum(np.clip(p - np.exp(e) * p_other, 0, None)) * dt for e in epsilon])


@pytest.mark.parametrize("r,alpha", [(0.5, 1.0), (2.0, 0.3)])
def test_the_vertex_pair_dominates_every_two_class_pair(r, alpha):
    epsilon = np.array([-0.5, 0.0, 0.1, 0.4, 1.0])
    vertex = _hockey_stick(r, alpha, 1.0, 0.0, epsilon)
    for theta, theta_other in [(0.9, 0.1), (0.7, 0.2), (0.2, 0.6), (1.0, 0.5), (0.5, 0.0)]:
        assert np.all(_hockey_stick(r, alpha, theta, theta_other, epsilon) <= vertex + 1e-9)


def _exact_step_delta(q: float, r: float, alpha: float, epsilon: float) -> float:
    """delta(eps) of (1-q) bot + q P_1 vs (1-q) bot + q P_0: (1-q)(1-e^eps)_+ + q [P_1(L > eps) - e^eps P_0(L > eps)],
    L = r logit(X), with 40-digit incomplete Beta functions."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    eps = mpmath.mpf(epsilon)
    y = 1 / (1 + mpmath.exp(eps / r))  # 1 - expit(eps / r)
    above_1 = mpmath.betainc(alpha, alpha + r, 0, y, regularized=True)
    above_0 = mpmath.betainc(alpha + r, alpha, 0, y, regularized=True)
    return float((1 - q) * max(1 - mpmath.exp(eps), 0) + q * (above_1 - mpmath.exp(eps) * above_0))


@pytest.mark.parametrize("q,r,alpha", [(0.01, 0.0804, 1.0), (1.0, 0.3, 0.5), (0.2, 1.5, 3.0)])
def test_single_step_pld_is_pessimistic_by_at_most_one_grid_step(q, r, alpha):
    grid = 1e-3
    pld = two_class_vertex_pld(q, r, alpha, grid)
    for epsilon in (0.0, 0.05, 0.3, 1.0, 3.0):
        got = pld.get_delta_for_epsilon(epsilon)
        # rounding every loss up by < one grid step: delta(eps) <= got <= delta(eps - grid)
        assert _exact_step_delta(q, r, alpha, epsilon) <= got <= _exact_step_delta(q, r, alpha, epsilon - grid) + 1e-13


def test_masses_cover_the_whole_distribution():
    lowest, masses, infinity_mass = two_class_vertex_masses(0.3, 0.2, 1.0, 1e-3)
    total = masses.sum() + infinity_mass
    assert 1.0 <= total <= 1.0 + 1e-10
    assert lowest < 0 and masses[-lowest] >= 0.7  # "not sampled": loss exactly 0
    assert np.all(masses >= 0) and 0 < infinity_mass < 1e-25
    # the mass at and above each grid loss is at least the exact tail P(L > (k - 1) h) of the sampled part
    h, losses = 1e-3, 1e-3 * (lowest + np.arange(masses.size))
    tail = np.cumsum(masses[::-1])[::-1] + infinity_mass
    for k in (masses.size - 1, masses.size - 500, -lowest + 300):
        exact = 0.3 * betainc(1.0, 1.2, expit(-(losses[k] - h) / 0.2))
        assert tail[k] >= exact


def test_composed_two_class_pld_lies_between_the_exact_lower_bound_and_the_rdp_bound():
    """T = 200 steps at q = 0.05: the audit's exact lower bound for the same pair <= PLD route <= RDP default."""
    q, r, alpha, steps, delta = 0.05, 0.1, 1.0, 200, 1e-5
    upper = two_class_vertex_pld(q, r, alpha, 1e-4).self_compose(steps).get_epsilon_for_delta(delta)
    lower = epsilon_lower_bound(dirichlet_shift_laws(r, alpha, grid=1 << 16), q, steps, delta,
                                directions=("replace-one",))["replace-one"]
    rdp = epsilon_after("dirichlet", steps=steps, delta=delta, sample_rate=q, concentration=r, alpha=alpha)
    assert lower <= upper <= lower + 0.02 * upper
    assert upper < rdp
