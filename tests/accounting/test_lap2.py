"""Lap2 accountants: the seed's numbers, the spec's exact lower bounds, and the fast sums."""

import numpy as np
import pytest
from scipy import integrate
from scipy.special import logsumexp

from dpnoise.accounting.rdp.conversion import epsilon_from_rdp
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.rdp.lap2 import (
    lap2_add_only_rdp,
    lap2_paper_rdp,
    lap2_sound_rdp,
    majorization_log_moments,
)
from dpnoise.accounting.rdp.laplace import log_laplace_moment, log_laplace_moment_excess
from dpnoise.accounting.rdp.logmath import log_binomial_weights
from dpnoise.accounting.rdp.orders import INTEGER_ORDERS
from dpnoise.accounting.rdp.subsampling import log_moment_remove_direction_bound

Q, T, N, DELTA = 0.0043, 5860, 26010, 1e-5  # the seed's MNIST setting


def eps(rdp_fn, b, n=N, q=Q, steps=T):
    return epsilon_from_rdp(INTEGER_ORDERS, steps * rdp_fn(q, b, n, INTEGER_ORDERS), DELTA)[0]


@pytest.mark.parametrize("b,expected", [(0.4, 7.94), (0.799, 3.42)])
def test_paper_accountant_reproduces_seed(b, expected):
    assert eps(lap2_paper_rdp, b) == pytest.approx(expected, abs=0.005)


# docs/theory/lap2.md §3: exact lower bounds on the true epsilon (worst k found), and §4's default values.
LOWER_BOUNDS = {0.4: 31.7, 0.8: 2.8, 1.296: 1.13, 2.46: 0.48, 4.70: 0.22}
SPEC_DEFAULT = {0.4: 65.9, 0.8: 3.41, 1.296: 1.26, 2.46: 0.55, 4.70: 0.27}


@pytest.mark.parametrize("b", sorted(LOWER_BOUNDS))
def test_sound_accountant_is_above_exact_lower_bounds(b):
    value = eps(lap2_sound_rdp, b)
    assert value > LOWER_BOUNDS[b]
    assert value == pytest.approx(SPEC_DEFAULT[b], rel=2e-3, abs=0.011)


def test_paper_accountant_is_below_the_truth_at_small_b():
    """The reason lap2-paper is never a default: 7.94 < 31.7 (a proven lower bound)."""
    assert eps(lap2_paper_rdp, 0.4) < LOWER_BOUNDS[0.4]


def _x(n):
    i = np.arange(1, n + 1, dtype=float)
    return 1.0 / (np.sqrt(i) + np.sqrt(i - 1))


@pytest.mark.parametrize("b", [0.4, 1.3])
def test_paper_fast_sum_equals_brute_force(b):
    orders = np.array([2.0, 3.0, 7.0, 30.0, 128.0])
    t = _x(N) / b
    eta = np.arange(129)
    # log sum_eta w_eta F = log1p(sum_eta w_eta (F - 1)): summing log(1 + tiny) over 26010 terms
    # through logsumexp would lose ~1e-12 absolute, so sum the excesses.
    log_excess = log_laplace_moment_excess(t[:, None], eta[None, :])  # (n, eta)
    log_w = log_binomial_weights(Q, orders)  # (orders, eta)
    exact = np.array([np.log1p(np.exp(logsumexp(lw[None, :] + log_excess, axis=1))).sum() for lw in log_w])
    exact /= orders - 1
    np.testing.assert_allclose(lap2_paper_rdp(Q, b, N, orders), exact, rtol=1e-9)


@pytest.mark.parametrize("n", [999, 1000, 1001, 5000, N])
def test_majorization_rule_is_a_tight_upper_bound(n):
    t = _x(n) / 0.7
    exact = log_laplace_moment(t[:, None], np.arange(65)[None, :]).sum(axis=0)
    bound = majorization_log_moments(0.7, n, 64)
    assert np.all(bound >= exact * (1 - 1e-13))
    np.testing.assert_allclose(bound, exact, rtol=2e-3)


@pytest.mark.parametrize("b", [0.005, 0.1, 0.7, 5.0, 3000.0])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 500, 1000])
def test_majorization_head_block_is_an_upper_bound_within_2e_12(b, n):
    """Up to n = 1000 the rule replaces the term-by-term sum by Euler-Maclaurin (inflated by 1e-12)."""
    t = _x(n) / b
    exact = log_laplace_moment(t[:, None], np.arange(257)[None, :]).sum(axis=0)
    bound = majorization_log_moments(b, n, 256)
    assert np.all(bound >= exact)  # the rounding raise covers the fast sum's error
    assert np.all(bound <= exact * (1 + 2e-12) + 1e-300)


def test_defined_and_monotone_for_n_from_1_to_1e12():
    values = [(eps(lap2_sound_rdp, 1.0, n), eps(lap2_paper_rdp, 1.0, n)) for n in (1, 10, 1000, 1001, 10**5, 10**9, 10**12)]
    sound, paper = np.array(values).T
    assert np.all(np.isfinite(sound)) and np.all(np.isfinite(paper))
    assert np.all(np.diff(sound) >= -1e-12) and np.all(np.diff(paper) >= -1e-12)


def test_large_n_add_direction_equals_sampled_gaussian():
    """Gaussian domination is tight as n grows: the add bound becomes the sampled-Gaussian RDP."""
    np.testing.assert_allclose(
        lap2_add_only_rdp(Q, 0.9, 10**12, INTEGER_ORDERS),
        sampled_gaussian_rdp(Q, 0.9, INTEGER_ORDERS),
        rtol=1e-10,
    )


def test_sound_is_at_least_add_only_and_fractional_orders_take_the_next_integer_bound():
    orders = np.array([1.5, 2.0, 8.0, 64.0])
    sound, add = lap2_sound_rdp(Q, 0.8, N, orders), lap2_add_only_rdp(Q, 0.8, N, orders)
    # D is non-decreasing in the order, so the sound curve's envelope bounds order 1.5 by order 2.
    assert sound[0] == sound[1] and np.isinf(add[0])
    assert np.all(np.diff(sound) >= 0)
    assert np.all(sound[1:] >= add[1:] * (1 - 1e-12))


@pytest.mark.parametrize("q,b", [(0.0043, 0.5), (0.1, 1.0), (0.3, 2.0)])
def test_remove_direction_lemma_bounds_exact_1d_moment(q, b):
    """E_P0[(1-q+qX)^-(a-1)] for a 1-D Laplace shift by numerical integration <= the lemma."""
    for order in (2, 4, 9):
        def integrand(z):
            x = np.exp((np.abs(z) - np.abs(z - 1.0)) / b)
            return np.exp(-np.abs(z) / b) / (2 * b) * (1 - q + q * x) ** (-(order - 1))

        exact = sum(integrate.quad(integrand, lo, hi, limit=200)[0] for lo, hi in [(-np.inf, 0), (0, 1), (1, np.inf)])
        bound = log_moment_remove_direction_bound(q, np.array([order]), log_laplace_moment(1.0 / b, 2))[0]
        assert np.log(exact) <= bound + 1e-12
