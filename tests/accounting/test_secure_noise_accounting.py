"""Secure-mode plans: grids, exact integer parameters at the inflated clip, the smoothing correction."""

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate

from dpnoise.accounting import epsilon_after
from dpnoise.accounting.secure_noise import (
    GRID_SLACK,
    MAX_GAUSSIAN_VARIANCE,
    MAX_LAPLACE_STEPS,
    SMOOTHING,
    discrete_gaussian_budget,
    discrete_gaussian_epsilon,
    grid_rounding,
    plan_discrete_gaussian,
    plan_discrete_laplace,
    rounding_grid,
    smoothing_log_ratio,
)
from dpnoise.accounting.validation import InvalidParameterError


@pytest.mark.parametrize("clip, n, norm_ord", [(1.0, 26_010, 2), (0.1, 22_700_000, 2), (3.0, 1, 2),
                                               (1.0, 26_010, 1), (1.0, 22_700_000, 1)])
def test_grid_is_the_coarsest_power_of_two_within_the_slack(clip, n, norm_ord):
    grid = rounding_grid(clip, n, norm_ord)
    assert math.frexp(grid)[0] == 0.5
    terms = math.isqrt(n - 1) + 1 if norm_ord == 2 else n
    assert Fraction(grid) * terms <= Fraction(GRID_SLACK) * Fraction(clip) < 2 * Fraction(grid) * terms
    rounding = grid_rounding(clip, n, norm_ord)
    assert Fraction(rounding.inflated_clip) >= Fraction(clip) + Fraction(grid) * terms
    assert rounding.inflation <= 1 + GRID_SLACK * (1 + 1e-12)


def test_rounding_bound_holds_for_adversarial_sums():
    """||round(S/g) - round(S'/g)|| g <= ||S - S'|| + g r over random and half-way sums."""
    rng = np.random.default_rng(0)
    grid, n = 2.0 ** -6, 400
    rounding = grid_rounding(1.0, n, 2, grid=grid)
    for _ in range(200):
        s = rng.integers(-100, 100, n) * grid + grid / 2 * rng.integers(0, 2, n)  # ties included
        v = rng.normal(size=n)
        v /= np.linalg.norm(v)
        moved = np.linalg.norm((np.round((s + v) / grid) - np.round(s / grid)) * grid)
        assert moved <= rounding.inflated_clip


@pytest.mark.parametrize("b, clip, n, norm_ord", [(0.8, 1.0, 26_010, 2), (1.3, 0.7, 22_700_000, 2),
                                                  (2.0, 1.0, 22_700_000, 1), (1e-3, 1.0, 10, 2)])
def test_laplace_steps_are_the_least_integer_covering_the_inflated_scale(b, clip, n, norm_ord):
    plan = plan_discrete_laplace(b, clip, n, norm_ord)
    need = Fraction(b) * plan.rounding.exact_inflated_clip / (Fraction(clip) * Fraction(plan.rounding.grid))
    assert plan.steps >= need > plan.steps - 1
    assert 1 <= plan.steps <= MAX_LAPLACE_STEPS


@pytest.mark.parametrize("sigma, clip, n", [(0.8, 1.0, 26_010), (1.0, 1.0, 22_700_000), (0.5, 3.0, 7),
                                            (20.0, 1.0, 10 ** 9)])
def test_gaussian_variance_covers_the_inflated_noise_plus_smoothing(sigma, clip, n):
    plan = plan_discrete_gaussian(sigma, clip, n)
    target = (Fraction(sigma) * plan.rounding.exact_inflated_clip / Fraction(plan.rounding.grid)) ** 2 + SMOOTHING ** 2
    assert target <= plan.variance < target + plan.steps
    assert plan.width <= plan.steps and plan.variance < MAX_GAUSSIAN_VARIANCE


def test_default_grids_are_coarsened_for_huge_noise_and_explicit_ones_refused():
    plan = plan_discrete_laplace(1e4, 1.0, 10 ** 6, 1)
    assert plan.steps <= MAX_LAPLACE_STEPS and plan.rounding.grid > rounding_grid(1.0, 10 ** 6, 1)
    with pytest.raises(InvalidParameterError, match="^grid .* too fine for the Laplace scale"):
        plan_discrete_laplace(1e4, 1.0, 10 ** 6, 1, grid=2.0 ** -31)
    plan = plan_discrete_gaussian(300.0, 1.0, 10 ** 9)
    assert plan.variance < MAX_GAUSSIAN_VARIANCE
    with pytest.raises(InvalidParameterError, match="^grid .* too fine for the noise multiplier"):
        plan_discrete_gaussian(300.0, 1.0, 10 ** 9, grid=2.0 ** -30)


@pytest.mark.parametrize("call, name", [
    (lambda: rounding_grid(1.0, 10, 3), "norm_ord"),
    (lambda: grid_rounding(1.0, 10, 2, grid=0.3), "grid must be a power of two"),
    (lambda: grid_rounding(1.0, 0, 2), "coordinates"),
    (lambda: plan_discrete_laplace(1.0, -1.0, 10, 2), "clip"),
    (lambda: plan_discrete_gaussian(0.0, 1.0, 10), "noise_multiplier"),
    (lambda: smoothing_log_ratio(10, 10, smoothing=0.1), "smoothing"),
])
def test_bad_input_is_refused_by_name(call, name):
    with pytest.raises(InvalidParameterError, match=f"^{name}"):
        call()


@pytest.mark.parametrize("tau", [1, 2, SMOOTHING])
def test_smoothing_ratio_bounds_the_exact_theta_function_ratio(tau):
    mp.mp.dps = 40
    eta = 2 * mp.nsum(lambda m: mp.exp(-2 * mp.pi ** 2 * tau ** 2 * m ** 2), [1, mp.inf])
    kappa = mp.log1p(eta) - mp.log1p(-eta)
    ours = smoothing_log_ratio(3, 5, smoothing=tau)
    assert ours >= 15 * kappa
    assert ours <= 15 * kappa * (1 + 1e-7)


def test_discrete_gaussian_is_within_the_ratio_of_the_smoothed_continuous_gaussian():
    """Lemma of docs/theory/secure_noise.md §3.1 at tau = 1 (kappa = 1.1e-8, visible in double
    precision): sum_k e^{-(k-u)^2/2} is within [1 - eta, 1 + eta] sqrt(2 pi), and the randomized
    rounding of N(x, s^2) onto Z has pmf within e^{+-kappa} of N_Z(x, s^2 + 1)."""
    tau, s = 1.0, 0.6
    variance = s ** 2 + tau ** 2
    kappa = smoothing_log_ratio(1, 1, smoothing=1)
    assert 1e-8 < kappa < 2e-8
    ks = np.arange(-40, 41)

    def theta(u):
        return np.exp(-(ks - u) ** 2 / (2 * tau ** 2)).sum()

    discrete = np.exp(-ks ** 2 / (2 * variance))
    discrete /= discrete.sum()
    worst = 0.0
    for j in range(-2, 3):
        def integrand(u):
            return math.exp(-u ** 2 / (2 * s ** 2) - (j - u) ** 2 / (2 * tau ** 2)) / theta(u)
        smoothed = integrate.quad(integrand, -12, 12, epsabs=0, epsrel=1e-13, limit=400,
                                  points=[0.0])[0] / (s * math.sqrt(2 * math.pi))
        worst = max(worst, abs(math.log(discrete[j + 40] / smoothed)))
    assert worst <= kappa * 1.01
    # the theta function's range is met (the ratio's bound is not loose by construction)
    eta = math.expm1(kappa / 2)
    assert theta(0.0) / math.sqrt(2 * math.pi) - 1 == pytest.approx(eta, rel=1e-3)
    assert 1 - theta(0.5) / math.sqrt(2 * math.pi) == pytest.approx(eta, rel=1e-3)


def test_corrected_epsilon_is_above_the_continuous_one_by_a_negligible_amount():
    def epsilon_at(delta):
        return epsilon_after("gaussian", steps=1000, delta=delta, sample_rate=0.01, noise_multiplier=1.0)

    plain = epsilon_at(1e-5)
    secure = discrete_gaussian_epsilon(epsilon_at, 1e-5, 1000, 22_700_000)
    assert secure > plain and secure == pytest.approx(plain, rel=1e-12)
    asked = []
    discrete_gaussian_epsilon(lambda d: asked.append(d) or 0.0, 1e-5, 10, 10)
    assert asked[0] < 1e-5
    assert discrete_gaussian_epsilon(lambda d: 0.0, 1e-5, 10, 10) > 0.0


@pytest.mark.parametrize("target, steps, n", [(1.0, 45, 1210), (8.0, 3157, 22_700_000), (1e-3, 10 ** 6, 10 ** 9),
                                              (3.0, 0, 1)])
def test_calibration_budget_is_the_largest_continuous_target_meeting_the_corrected_one(target, steps, n):
    """An accountant answering at most epsilon' at delta' gives a corrected epsilon within the target;
    one float more does not (epsilon' is the largest), and delta' is the delta the correction asks for."""
    allowed, shrunk = discrete_gaussian_budget(target, 1e-5, steps, n)
    asked = []
    assert discrete_gaussian_epsilon(lambda d: asked.append(d) or allowed, 1e-5, steps, n) <= target
    assert asked == [shrunk] and shrunk < 1e-5
    assert discrete_gaussian_epsilon(lambda d: math.nextafter(allowed, math.inf), 1e-5, steps, n) > target
