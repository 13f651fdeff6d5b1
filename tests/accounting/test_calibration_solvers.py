"""The root finders of the noise calibration: the secant method for costly (PLD) epsilons."""

import math

import pytest

from dpnoise.accounting.calibration import solve_by_secant, solve_smallest
from dpnoise.accounting.solvers import find_root


def counting(function):
    """``function`` and the list of the points it was evaluated at."""
    points = []

    def wrapped(x):
        points.append(x)
        return function(x)

    return wrapped, points


@pytest.mark.parametrize("power,start", [(1.0, 1.3), (3.7, 0.8), (0.5, 2.0)])
def test_secant_reaches_the_root_from_the_admissible_side_in_few_evaluations(power, start):
    """epsilon = 2 / x^power has its root at x* = (2 / target)^(1/power); the answer is within the
    tolerance above it, never below, in a handful of evaluations."""
    target = 0.7
    root = (2.0 / target) ** (1.0 / power)
    epsilon_of, points = counting(lambda x: 2.0 / x**power)
    x, slope = solve_by_secant(epsilon_of, target, initial=start * root, tolerance=1e-5)
    assert epsilon_of(x) <= target
    assert root <= x <= root * (1 + 2e-5)
    assert slope == pytest.approx(-power, rel=1e-3)
    assert len(points) <= 7
    brent, brent_points = counting(lambda x: 2.0 / x**power)
    solve_smallest(brent, target, initial=start * root, factor=1.25, tolerance=1e-5)
    assert len(points) < len(brent_points)


def test_secant_gives_up_on_values_it_cannot_use():
    """NaN, an epsilon of 0, or +inf before any admissible point: None (the caller brackets instead)."""
    assert solve_by_secant(lambda x: math.nan, 1.0, initial=1.0, tolerance=1e-5) is None
    assert solve_by_secant(lambda x: 0.0, 1.0, initial=1.0, tolerance=1e-5) is None
    assert solve_by_secant(lambda x: math.inf, 1.0, initial=1.0, tolerance=1e-5) is None


def test_secant_bisects_across_an_infinite_region():
    """Below x = 0.9 the epsilon is +inf (a route that cannot account that noise): the search stays
    inside the bracket and still ends within the tolerance of the root 1.0."""
    x, _ = solve_by_secant(lambda x: math.inf if x < 0.9 else 1.0 / x, 1.0, initial=1.5, tolerance=1e-5,
                           first_slope=-10.0, max_evaluations=40)
    assert 1.0 <= x <= 1.0 + 2e-5


def test_secant_stops_after_its_evaluation_budget():
    """A function it cannot converge on (a step) leaves it within max_evaluations."""
    epsilon_of, points = counting(lambda x: 2.0 if x < 1.0 else 0.5)
    assert solve_by_secant(epsilon_of, 1.0, initial=3.0, tolerance=1e-9, max_evaluations=6) is None
    assert len(points) <= 6


@pytest.mark.parametrize("f,low,high,root", [
    (lambda x: x**3 - 2.0, 0.0, 2.0, 2.0 ** (1 / 3)),
    (lambda x: math.exp(x) - 5.0, -3.0, 10.0, math.log(5.0)),
    (lambda x: math.tanh(50.0 * (x - 0.123)), -1.0, 1.0, 0.123),       # steep: regula falsi alone stalls
    (lambda x: 1.0 if x > 0.77 else -1.0, 0.0, 1.0, 0.77),              # a jump (as on a PLD grid)
    (lambda x: -((x - 0.3) ** 5), 0.0, 1.0, 0.3),                        # flat at the root, decreasing
])
def test_find_root_brackets_to_the_tolerance(f, low, high, root):
    calls = []
    found = find_root(lambda x: calls.append(x) or f(x), low, high, xtol=1e-14, rtol=1e-13)
    assert abs(found - root) <= 1e-12
    assert len(calls) <= 300


def test_find_root_needs_a_sign_change():
    with pytest.raises(ValueError, match="opposite signs"):
        find_root(lambda x: x * x + 1.0, -1.0, 1.0, xtol=1e-12, rtol=1e-12)



def test_minimum_calibration_checks_a_pld_route_on_its_coarse_grid_first():
    """A minimum's calibration asks whether its PLD route is above target at the RDP route's answer:
    where the coarse-grid epsilon (never below the route's own) is already within the target, that
    question computes no finer pass, and the answer is still the PLD route's own smallest noise."""
    from unittest import mock

    from dpnoise.accounting import calibrate_noise
    from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
    from dpnoise.accounting.pld.distribution import pld_epsilon

    refines = []

    def recorded(history, delta, refine=True):
        refines.append(refine)
        return pld_epsilon(history, delta, refine)

    setting = dict(target_epsilon=3.0, delta=1e-5, sample_rate=0.01, steps=400, compare=False)
    with mock.patch("dpnoise.accounting.solvers.pld_epsilon", recorded):
        noise = calibrate_noise("gaussian", **setting).noise
    assert refines[0] is False  # the skip question, on the coarse grid alone
    assert noise == pytest.approx(calibrate_noise("gaussian-pld", **setting).noise, rel=2e-5)  # its tolerance
    history = ((PoissonSampledEvent(0.01, GaussianEvent(noise)), 400),)
    assert pld_epsilon(history, 1e-5, refine=False)[0] >= pld_epsilon(history, 1e-5)[0]


@pytest.mark.parametrize("delta", [1e-5, 1e-12])
def test_pld_calibration_keeps_the_coarse_answer_only_where_refining_gains_less_than_converged(delta):
    from dpnoise.accounting import calibrate_noise
    from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
    from dpnoise.accounting.pld.distribution import CONVERGED, pld_epsilon
    from dpnoise.accounting.solvers import solve_costly

    target, rate, steps = 2.0, 0.02, 500

    def refined(noise):
        return pld_epsilon(((PoissonSampledEvent(rate, GaussianEvent(noise)), steps),), delta)[0]

    noise = calibrate_noise("gaussian-pld", target_epsilon=target, delta=delta, sample_rate=rate, steps=steps,
                            compare=False).noise
    assert refined(noise) <= target
    smallest, _ = solve_costly(refined, target, noise, 1.05, -1.0)  # the refined route's own answer
    assert smallest * (1 - 2e-5) <= noise <= smallest * (1 + CONVERGED)
