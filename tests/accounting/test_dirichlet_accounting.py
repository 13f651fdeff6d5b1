"""Dirichlet accountant and r* calibration (docs/theory/dirichlet.md §1-3)."""

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import gammaln

from dpnoise.accounting import (
    UnreachableTargetError,
    UnsoundAccountantWarning,
    calibrate_dirichlet_r,
    epsilon_after,
    steps_from_epochs,
)
from dpnoise.accounting.rdp.dirichlet import (
    VERTEX_REAL_ORDER_MIN,
    exact_vertex_rdp,
    ponnoprat_rdp,
    sampled_dirichlet_rdp,
    vertex_bound_holds,
)
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS, INTEGER_ORDERS
from dpnoise.accounting.rdp.subsampling import log_moment_shared_inclusion


def test_exact_vertex_sanity_value():
    assert exact_vertex_rdp(0.5, 1.0, np.array([2.0]))[0] == pytest.approx(np.log(2), rel=1e-12)


def _renyi_dirichlet(a_vec, b_vec, lam):
    """D_lam(Dir(a)||Dir(b)) from the multivariate Beta formula (docs/theory/dirichlet.md §1)."""
    log_beta = lambda v: gammaln(v).sum() - gammaln(v.sum())  # noqa: E731
    mix = lam * a_vec + (1 - lam) * b_vec
    return (log_beta(mix) - lam * log_beta(a_vec) - (1 - lam) * log_beta(b_vec)) / (lam - 1)


@pytest.mark.parametrize("r,alpha", [(0.3, 1.0), (0.1, 0.5), (2.0, 10.0)])
def test_exact_vertex_is_the_vertex_divergence_and_below_ponnoprat(r, alpha):
    orders = np.arange(2, int(1 + alpha / r) + 1, dtype=float)
    orders = orders[orders < 1 + alpha / r]
    e1, e2 = np.array([1.0, 0, 0]), np.array([0, 1.0, 0])
    direct = [_renyi_dirichlet(r * e1 + alpha, r * e2 + alpha, lam) for lam in orders]
    np.testing.assert_allclose(exact_vertex_rdp(r, alpha, orders), direct, rtol=1e-10)
    assert np.all(exact_vertex_rdp(r, alpha, orders) <= ponnoprat_rdp(r, alpha, orders))


def test_inadmissible_orders_are_infinite():
    rdp = sampled_dirichlet_rdp(0.01, 0.3, 1.0, INTEGER_ORDERS)
    assert np.all(np.isfinite(rdp[INTEGER_ORDERS < 1 + 1 / 0.3]))
    assert np.all(np.isinf(rdp[INTEGER_ORDERS >= 1 + 1 / 0.3]))


def test_general_subsampling_bound_is_above_tight_form():
    general = sampled_dirichlet_rdp(0.01, 0.05, 1.0, INTEGER_ORDERS, subsampling="general")
    tight = sampled_dirichlet_rdp(0.01, 0.05, 1.0, INTEGER_ORDERS, subsampling="tight")
    finite = np.isfinite(general)
    assert np.all(general[finite] >= tight[finite])


@pytest.mark.parametrize("q,r,alpha", [(0.01, 0.3, 1.0), (0.2, 0.1, 0.5), (1.0, 0.5, 1.0)])
def test_replace_one_subsampling_is_the_exact_divergence_of_the_released_mixtures(q, r, alpha):
    """D_a((1-q) bot + q Beta(alpha+r, alpha) || (1-q) bot + q Beta(alpha, alpha+r)) by numerical integration
    (two classes: the worst pair is two vertices, and Dir(r e_k + alpha) has Beta marginals); real orders included."""
    orders = np.concatenate([[1.6, 2.5], np.arange(2, int(np.ceil(1 + alpha / r)), dtype=float)])
    p, q_ = stats.beta(alpha + r, alpha), stats.beta(alpha, alpha + r)
    for order, value in zip(orders, sampled_dirichlet_rdp(q, r, alpha, orders)):
        moment, _ = integrate.quad(lambda x: np.exp(order * p.logpdf(x) + (1 - order) * q_.logpdf(x)), 0, 1,
                                   epsabs=0, epsrel=1e-9, limit=400)
        assert value == pytest.approx(np.log(1 - q + q * moment) / (order - 1), rel=1e-6), order


def _monte_carlo_delta(r: float, alpha: float, q: float, steps: int, epsilon: float, runs: int, seed: int):
    """(estimate, standard error) of delta(epsilon) = E_P[(1 - exp(epsilon - L))_+] for the Dirichlet pair
    s = e_1 vs e_2 under replace-one adjacency: L sums one sample's loss r (log G1 - log G2), G1 ~ Gamma(alpha + r),
    G2 ~ Gamma(alpha), over the Bin(steps, q) steps that include the example (the others release nothing of it)."""
    rng = np.random.default_rng(seed)
    included = rng.binomial(steps, q, size=runs)
    loss = np.zeros(runs)
    for k in range(included.max()):
        live = included > k
        loss[live] += r * (np.log(rng.gamma(alpha + r, size=live.sum())) - np.log(rng.gamma(alpha, size=live.sum())))
    hockey = np.clip(1 - np.exp(epsilon - loss), 0, None)
    return hockey.mean(), hockey.std() / np.sqrt(runs)


def test_the_default_stands_and_the_papers_add_remove_reading_is_refuted_by_monte_carlo():
    """At r* for epsilon 4 (the theory notes' setting), a Monte-Carlo estimate of the true delta(4): far above
    1e-5 for the add/remove reading's r* (its epsilon is not a bound), not above it for the default's."""
    q, delta, target = 256 / 50000, 1e-5, 4.0
    steps = steps_from_epochs(30, q)
    with pytest.warns(UnsoundAccountantWarning, match="NOT a valid bound under replace-one"):
        paper = calibrate_dirichlet_r(target, delta, q, steps, alpha=1.0, accountant="dirichlet-add-remove").noise
    sound = calibrate_dirichlet_r(target, delta, q, steps, alpha=1.0).noise
    assert sound < paper
    refuted, error = _monte_carlo_delta(paper, 1.0, q, steps, target, 200_000, seed=0)
    assert refuted - 5 * error > 100 * delta
    held, error = _monte_carlo_delta(sound, 1.0, q, steps, target, 200_000, seed=1)
    assert held - 5 * error <= delta


@pytest.mark.parametrize("target,base,expected", [(4.0, "dirichlet-ponnoprat", 0.248), (1.0, "dirichlet-ponnoprat", 0.0953),
                                                   (4.0, "dirichlet-add-remove", 0.333), (1.0, "dirichlet-add-remove", 0.111)])
def test_calibration_reproduces_spec_examples_of_the_papers_reading(target, base, expected):
    q = 256 / 50000
    with pytest.warns(UnsoundAccountantWarning):
        result = calibrate_dirichlet_r(target, 1e-5, q, steps_from_epochs(30, q), alpha=1.0, accountant=base)
    assert result.noise == pytest.approx(expected, abs=6e-4)
    assert result.epsilon <= target


def test_default_calibration_meets_its_target_under_the_exact_replace_one_rdp():
    q = 256 / 50000
    steps = steps_from_epochs(30, q)
    result = calibrate_dirichlet_r(4.0, 1e-5, q, steps, alpha=1.0)
    assert result.accountant == "dirichlet" and result.epsilon <= 4.0
    # the largest such r: 1% more noise-free concentration overshoots
    assert epsilon_after("dirichlet", steps=steps, delta=1e-5, sample_rate=q, concentration=result.noise * 1.01,
                         alpha=1.0) > 4.0


def test_the_add_remove_floor_is_reported_as_unreachable_and_the_default_has_none():
    q = 0.02048
    with pytest.warns(UnsoundAccountantWarning), pytest.raises(UnreachableTargetError, match=r"floor of epsilon=1\.8"):
        calibrate_dirichlet_r(1.0, 1e-5, q, steps_from_epochs(100, q), accountant="dirichlet-add-remove")
    assert calibrate_dirichlet_r(1.0, 1e-5, q, steps_from_epochs(100, q)).epsilon <= 1.0


def test_shared_inclusion_is_above_the_exact_value_by_at_most_a_few_ulp():
    """log(1 - q + q e^R) against 50-digit arithmetic, also where 1 - q + q e^R rounds to 1 in double precision."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for q in (1e-6, 0.003, 0.3, 0.9):
        R = np.array([1e-300, 1e-13, 1e-6, 0.5, 5.0, 300.0, 699.0, 701.0, 1e4])
        got = log_moment_shared_inclusion(q, R)
        exact = np.array([float(mpmath.log1p(mpmath.mpf(q) * mpmath.expm1(mpmath.mpf(r)))) for r in R])
        assert np.all(got >= exact) and np.all(got <= exact * (1 + 1e-14)), q
    assert np.isinf(log_moment_shared_inclusion(0.01, np.array([np.inf]))[0])


def _mpmath_vertex_rdp(mpmath, r: float, alpha: float, order: float):
    """The two-vertex value of docs/theory/dirichlet.md Sec. 1.2 at the exact double inputs, in mpmath."""
    r, alpha, order = mpmath.mpf(r), mpmath.mpf(alpha), mpmath.mpf(order)
    return (mpmath.loggamma(alpha + order * r) + mpmath.loggamma(alpha - (order - 1) * r)
            - mpmath.loggamma(alpha + r) - mpmath.loggamma(alpha)) / (order - 1)


def test_exact_vertex_is_never_below_the_exact_value_and_within_1e_8_of_it():
    """60-digit reference for r from 1e-14 to 10 (the log-Gamma values cancel for small r)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    orders = np.array([1.6, 2.0, 2.5, 3.0, 7.3, 16.0, 64.0, 256.0])
    for alpha in (0.1, 1.0, 10.0):
        for r in np.logspace(-14, 1, 16):
            admissible = orders[orders < 1 + alpha / r]
            for order, got in zip(admissible, exact_vertex_rdp(r, alpha, admissible)):
                exact = _mpmath_vertex_rdp(mpmath, r, alpha, order)
                assert exact <= got <= exact * (1 + 1e-8), (alpha, r, order, got, exact)


def test_exact_vertex_at_tiny_r_and_near_the_order_limit():
    mpmath = pytest.importorskip("mpmath")
    cases = [(1e-8, 1.0, 2.0), (1e-12, 1.0, 6.0), (1e-100, 1.0, 2.0), (1e-60, 1e-8, 17.0),
             (0.5 * (1 - 1e-12), 1.0, 3.0), (1e-8 / 255 * (1 - 1e-12), 1e-8, 256.0)]
    for r, alpha, order in cases:
        mpmath.mp.dps = 60 - 2 * int(np.log10(r))  # the log-Gamma values agree to about -2 log10(r) digits
        got = exact_vertex_rdp(r, alpha, np.array([order]))[0]
        exact = _mpmath_vertex_rdp(mpmath, r, alpha, order)
        assert exact <= got <= exact * (1 + 1e-4) + 1e-307, (r, alpha, order, got, exact)


def test_the_default_is_positive_at_every_order_for_tiny_r():
    """Poisson-subsampled at q = 1e-6, r = 1e-9: never 0 (the issue's case), never below the exact value."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    q, r, alpha = 1e-6, 1e-9, 1.0
    got = sampled_dirichlet_rdp(q, r, alpha, DEFAULT_ORDERS)
    assert np.all(got > 0)
    for order, value in zip(DEFAULT_ORDERS[::7], got[::7]):
        moment = (order - 1) * _mpmath_vertex_rdp(mpmath, r, alpha, order)
        assert value >= mpmath.log1p(q * mpmath.expm1(moment)) / (order - 1), order


def test_vertex_bound_orders():
    orders = np.array([1.05, 1.5, 1.58, 1.58034, 1.6, 2.0, 2.5, 3.0])
    np.testing.assert_array_equal(vertex_bound_holds(0.1, orders), [False, False, False, True, True, True, True, True])
    assert vertex_bound_holds(0.5, orders).all()
    # the pole-part condition h(lambda) >= 0 of the proof changes sign between 1.5803 and 1.58034
    h = lambda lam: (lam - 1) / (2 * lam - 1) - lam * np.log(lam / (lam - 1)) + np.log((2 * lam - 1) / (lam - 1))  # noqa: E731
    assert h(1.5803) < 0 < h(VERTEX_REAL_ORDER_MIN)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 2.0])
def test_no_pair_of_three_class_inputs_exceeds_the_vertex_value_at_real_orders(alpha):
    """Random softmax pairs (d = 3), r up to just below the order limit: the statement of Sec. 1.2 at real orders."""
    rng = np.random.default_rng(3)
    for order in (1.6, 2.5, 7.3):
        for fraction in (0.3, 0.9, 0.999):
            r = fraction * alpha / (order - 1)
            vertex = exact_vertex_rdp(r, alpha, np.array([order]))[0]
            for _ in range(200):
                p, p_other = rng.dirichlet(np.full(3, 0.3), size=2)
                assert _renyi_dirichlet(r * p + alpha, r * p_other + alpha, order) <= vertex * (1 + 1e-12)


def test_the_vertex_value_fails_at_real_orders_near_1():
    """alpha = 0.01, order 1.05, d = 3: a non-vertex input exceeds the two-vertex value (why orders < 1.58034 are excluded)."""
    alpha, order = 0.01, 1.05
    r = 0.6 * alpha / (order - 1)
    vertex = exact_vertex_rdp(r, alpha, np.array([order]))[0]
    worst = max(_renyi_dirichlet(r * np.array([t, 1 - t, 0.0]) + alpha, r * np.array([0, 0, 1.0]) + alpha, order)
                for t in np.linspace(0, 1, 201))
    assert worst > 1.01 * vertex
