"""Output mechanisms accounted by the changed example's number of releases K ~ Bin(T, q).

docs/theory/dirichlet.md Sec. 2.4.

References, computed here independently of the library: mpmath (40 digits) for the Gaussian-DP profile, the
binomial tails and the exact penultimate-layer profile at small T; a direct sum over every count k = 0..T (SciPy's
binomial pmf, no window, no grouping, no rounding allowance) for larger T; the exact lower bounds of
:mod:`dpnoise.audit.pld`.
"""

import math
import warnings

import mpmath
import numpy as np
import pytest
from scipy import optimize, stats
from scipy.special import log_ndtr

from dpnoise.accounting import InvalidParameterError, get_accountant
from dpnoise.accounting.events import DirichletEvent, GaussianEvent, PoissonSampledEvent
from dpnoise.accounting.rdp.dirichlet import sampled_dirichlet_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS, INTEGER_ORDERS
from dpnoise.accounting.release_count import (
    EXACT_LOG_PROFILES,
    MAX_GROUPS,
    ReleaseCountAccountant,
    gaussian_log_profile,
    log_binomial_pmf_bound,
    log_binomial_tail_bound,
    register_exact_log_profile,
    release_count_delta,
    release_count_epsilon,
    release_counts,
)

mpmath.mp.dps = 30


def mp_binomial_weights(steps, q, top):
    q = mpmath.mpf(q)
    return [mpmath.binomial(steps, k) * q ** k * (1 - q) ** (steps - k) for k in range(top + 1)]


def mp_gdp_delta(eps, mu):
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in mpmath."""
    eps, mu = mpmath.mpf(eps), mpmath.mpf(mu)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def scipy_penultimate_epsilon(sigma, q, steps, delta, max_count=None):
    """The exact profile over every count 0..T (or up to ``max_count``, the mass above charged delta = 1) with SciPy
    (binomial pmf, log-space Gaussian-DP profile), by brentq."""
    k = np.arange(1, (steps if max_count is None else min(steps, max_count)) + 1)
    weight = stats.binom.pmf(k, steps, q)
    above = stats.binom.sf(k[-1], steps, q)
    mu = 2 * np.sqrt(k) / sigma

    def excess(eps):
        x = eps / mu - mu / 2
        head, gap = log_ndtr(-x), log_ndtr(-x) - log_ndtr(-x - mu) - eps
        return np.sum(weight * np.exp(head) * -np.expm1(-np.maximum(gap, 0))) + above - delta

    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return optimize.brentq(excess, 0.0, hi, xtol=1e-13, rtol=1e-13)


def mp_penultimate_epsilon(sigma, q, steps, delta, max_count=None):
    """The exact profile sum_k Bin(k; T, q) delta_GDP(eps; 2 sqrt(k) / sigma) solved for eps in mpmath, by bisection
    from a bracket around SciPy's root that is checked in mpmath (counts above ``max_count`` charged delta = 1,
    their mass summed exactly)."""
    top = steps if max_count is None else min(steps, max_count)
    weights = mp_binomial_weights(steps, q, top)
    above = 1 - mpmath.fsum(weights)

    def excess(eps):
        return mpmath.fsum(w * mp_gdp_delta(eps, 2 * mpmath.sqrt(k) / sigma)
                           for k, w in enumerate(weights) if k > 0) + above - delta

    guess = scipy_penultimate_epsilon(sigma, float(q), steps, delta, max_count)
    lo, hi = mpmath.mpf(guess) * (1 - 1e-7), mpmath.mpf(guess) * (1 + 1e-7)
    assert excess(lo) > 0 >= excess(hi), "the bracket does not hold the root"
    while hi - lo > 1e-15 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return float(hi)


def route_epsilon(name, noise, q, steps, delta, **step):
    keyword = "concentration" if name.startswith("dirichlet") else "noise_multiplier"
    return get_accountant(name).step(sample_rate=q, steps=steps, **{keyword: noise}, **step).get_epsilon(delta)


# -- the pieces, against mpmath ---------------------------------------------------------------------
@pytest.mark.parametrize("mu,x", [(mu, x) for mu in [1e-4, 1e-2, 0.3, 1.0, 5.0, 40.0, 2000.0]
                                  for x in [-3.0, -0.5, 0.5, 2.0, 8.0, 20.0, 37.0] if x + mu / 2 >= 0])
def test_gaussian_profile_is_an_upper_bound_within_rounding(mu, x):
    """x = eps / mu - mu / 2 (eps >= 0): from delta near 1 down to 1e-300."""
    eps = mu * (x + mu / 2)
    exact = mp_gdp_delta(eps, mu)
    bound = mpmath.exp(float(gaussian_log_profile(eps, np.array([mu]))[0]))
    assert bound >= exact
    assert bound <= exact * (1 + 1e-5)  # the rounding allowance: 16 ulp of terms of size x^2


@pytest.mark.parametrize("steps,q", [(50, 0.3), (1000, 0.01), (2000, 0.6)])
def test_binomial_tail_bounds_hold(steps, q):
    terms = mp_binomial_weights(steps, q, steps)
    mean = steps * q
    for k in {0, 1, math.floor(mean), math.ceil(mean), int(mean + 3 * math.sqrt(mean)), int(mean * 1.7), steps}:
        if k > steps:
            continue
        exact = mpmath.fsum(terms[k:]) if k >= mean else mpmath.fsum(terms[: k + 1])
        bound = float(log_binomial_tail_bound(steps, q, np.array([float(k)]))[0])
        assert bound >= float(mpmath.log(exact)) - 1e-12, k


@pytest.mark.parametrize("steps,q", [(1, 0.5), (7, 0.3), (50, 1e-3), (10**6, 1e-6), (10**7, 0.5), (10**12, 0.999)])
def test_binomial_weights_are_upper_bounds_within_rounding(steps, q):
    mean, sd = steps * q, math.sqrt(steps * q * (1 - q))
    candidates = (0, 1, 2, 15, 16, 17, int(mean), int(mean + 5 * sd), int(mean - 5 * sd), steps - 1, steps)
    counts = sorted({k for k in candidates if 0 <= k <= steps})
    bound = log_binomial_pmf_bound(steps, q, np.array(counts, dtype=float))
    for k, value in zip(counts, bound):
        exact = mpmath.log(mpmath.binomial(steps, k)) + k * mpmath.log(q) + (steps - k) * mpmath.log1p(-mpmath.mpf(q))
        # within 1e-8 (relative, of the weight) in the bulk, and 16 ulp of the terms' size (~T) far out
        assert float(exact) <= value <= float(exact) + 1e-12 * (1 + abs(float(exact))) + 1e-8, k


def test_release_counts_hold_all_the_mass_and_group_wide_windows():
    narrow = release_counts(5860, 0.00512, math.log(1e-20))
    assert narrow.counts[0] == 0 and np.all(np.diff(narrow.counts) == 1)  # every count, from 0 up
    for counts in (narrow, release_counts(10**7, 0.5, math.log(1e-25))):
        total = np.exp(counts.log_mass).sum() + math.exp(counts.log_tail)
        assert 1 - 1e-12 <= total <= 1 + 1e-10
    wide = release_counts(10**7, 0.5, math.log(1e-25))
    assert len(wide.counts) <= MAX_GROUPS and wide.log_tail <= math.log(1e-25)
    full = release_counts(7, 1.0, -690.0)  # q = 1: every step releases
    assert full.counts.tolist() == [7.0] and full.log_tail == -math.inf


# -- penultimate-gaussian-exact -----------------------------------------------------------------------
@pytest.mark.parametrize("sigma,q,steps", [(1.5, 0.3, 20), (0.5, 0.05, 40), (4.0, 1.0, 5)])
@pytest.mark.parametrize("delta", [1e-3, 1e-8, 1e-15])
def test_penultimate_exact_route_equals_the_mpmath_profile(sigma, q, steps, delta):
    reference = mp_penultimate_epsilon(sigma, q, steps, delta)
    value = route_epsilon("penultimate-gaussian-exact", sigma, q, steps, delta)
    assert reference <= value <= reference * (1 + 1e-9) + 1e-12


def test_tiny_sigma_setting_where_the_rdp_route_is_fifty_thousand_times_too_large():
    """sigma = 0.1, q = 1e-6, T = 1e6, delta = 1e-5: the replace-one RDP route gives 8.2e7, the exact profile 1525."""
    setting = dict(noise_multiplier=0.1, sample_rate=1e-6, steps=10**6)
    reference = mp_penultimate_epsilon(0.1, 1e-6, 10**6, 1e-5, max_count=40)  # P(K > 40) < 1e-48
    by_route = get_accountant("penultimate-gaussian").step(**setting).epsilon_by_route(1e-5)
    exact, _ = by_route["penultimate-gaussian-exact"]
    assert reference <= exact <= reference * (1 + 1e-9) and exact == pytest.approx(1525, abs=1)
    assert by_route["penultimate-gaussian-replace-one-rdp"][0] > 5e4 * exact
    epsilon, bound = get_accountant("penultimate-gaussian").step(**setting).get_epsilon_and_bound(1e-5)
    assert epsilon == exact and bound.startswith("penultimate-gaussian-exact: exact")


def test_the_exact_profile_is_the_gaussian_plugins_and_without_it_releases_take_the_renyi_conversion(monkeypatch):
    """The Gaussian plugin registers the k-release profile; the same accountant without it converts RDP."""
    setting = dict(noise_multiplier=0.5, sample_rate=0.05, steps=40)
    exact, bound = get_accountant("penultimate-gaussian-exact").step(**setting).get_epsilon_and_bound(1e-8)
    assert "exact profile" in bound
    with pytest.raises(InvalidParameterError, match="already has an exact release profile"):
        register_exact_log_profile(GaussianEvent, EXACT_LOG_PROFILES[GaussianEvent])
    monkeypatch.delitem(EXACT_LOG_PROFILES, GaussianEvent)
    release_count_epsilon.cache_clear(), release_count_delta.cache_clear()
    converted, bound = get_accountant("penultimate-gaussian-exact").step(**setting).get_epsilon_and_bound(1e-8)
    release_count_epsilon.cache_clear(), release_count_delta.cache_clear()
    assert "Renyi conversion per count" in bound and converted > exact


@pytest.mark.parametrize("sigma", [0.3, 2.0, 10.0])
@pytest.mark.parametrize("q,steps", [(1e-3, 5000), (0.05, 100), (1.0, 1)])
@pytest.mark.parametrize("delta", [1e-3, 1e-8, 1e-15])
def test_penultimate_exact_route_over_a_grid(sigma, q, steps, delta):
    """Equal to the direct sum within rounding; never above the RDP route; the default is their minimum."""
    exact = route_epsilon("penultimate-gaussian-exact", sigma, q, steps, delta)
    rdp = route_epsilon("penultimate-gaussian-replace-one-rdp", sigma, q, steps, delta)
    reference = scipy_penultimate_epsilon(sigma, q, steps, delta)
    assert reference * (1 - 1e-9) - 1e-12 <= exact <= reference * (1 + 1e-7) + 1e-12
    assert exact <= rdp * (1 + 1e-9) + 1e-12
    assert route_epsilon("penultimate-gaussian", sigma, q, steps, delta) == min(exact, rdp)


# -- dirichlet-release-count --------------------------------------------------------------------------
def direct_dirichlet_epsilon(r, alpha, q, steps, delta, orders):
    """sum over every count k = 0..T of Bin(k; T, q) times the Balle et al. conversion of k eps(a) at the best
    order per k (the base eps(a) from the library's two-vertex RDP), solved by brentq."""
    base = sampled_dirichlet_rdp(1.0, r, alpha, orders)
    finite = np.isfinite(base)
    a, curve = orders[finite], base[finite]
    k = np.arange(1, steps + 1)[:, None]
    weight = stats.binom.pmf(k[:, 0], steps, q)

    def excess(eps):
        log_delta = (a - 1) * (k * curve - eps + np.log1p(-1 / a)) - np.log(a)
        return np.sum(weight * np.exp(np.minimum(log_delta.min(axis=1), 0.0))) - delta

    return optimize.brentq(excess, 1e-6, 1e3, xtol=1e-13, rtol=1e-13)


def test_dirichlet_release_count_in_the_theory_notes_setting():
    """r = 0.0804, alpha = 1, q = 256/50000, 30 epochs (T = 5860), delta = 1e-5: at integer orders the release-count
    mixture gives 3.942 where the RDP route gives 3.999; every order of the default grid, less."""
    q, steps = 256 / 50000, math.ceil(30 / (256 / 50000))
    event = PoissonSampledEvent(q, DirichletEvent(0.0804, 1.0))
    at_integers, _ = release_count_epsilon(event, steps, 1e-5, None, tuple(INTEGER_ORDERS))
    integer_rdp = get_accountant("dirichlet-rdp", orders=INTEGER_ORDERS).step(
        concentration=0.0804, sample_rate=q, steps=steps, alpha=1.0).get_epsilon(1e-5)
    reference = direct_dirichlet_epsilon(0.0804, 1.0, q, steps, 1e-5, INTEGER_ORDERS)
    assert reference <= at_integers <= reference + 1e-9
    assert at_integers == pytest.approx(3.942, abs=5e-4) and integer_rdp == pytest.approx(3.999, abs=5e-4)
    default = route_epsilon("dirichlet", 0.0804, q, steps, 1e-5, alpha=1.0)
    assert default == route_epsilon("dirichlet-release-count", 0.0804, q, steps, 1e-5, alpha=1.0)
    assert default <= at_integers and default == pytest.approx(
        direct_dirichlet_epsilon(0.0804, 1.0, q, steps, 1e-5, DEFAULT_ORDERS), rel=1e-9)


@pytest.mark.parametrize("r,alpha", [(0.05, 1.0), (0.4, 1.0), (1.0, 3.0)])
@pytest.mark.parametrize("q,steps", [(0.01, 300), (0.2, 40), (1.0, 3)])
@pytest.mark.parametrize("delta", [1e-3, 1e-8, 1e-15])
def test_dirichlet_release_count_over_a_grid(r, alpha, q, steps, delta):
    mixture = route_epsilon("dirichlet-release-count", r, q, steps, delta, alpha=alpha)
    rdp = route_epsilon("dirichlet-rdp", r, q, steps, delta, alpha=alpha)
    reference = direct_dirichlet_epsilon(r, alpha, q, steps, delta, DEFAULT_ORDERS)
    assert reference * (1 - 1e-9) <= mixture <= reference * (1 + 1e-9) + 1e-12
    assert mixture <= rdp * (1 + 1e-9) + 1e-12
    assert route_epsilon("dirichlet", r, q, steps, delta, alpha=alpha) == min(mixture, rdp)


@pytest.mark.parametrize("name,noise,alpha", [("penultimate-gaussian-exact", 2.0, None),
                                              ("penultimate-gaussian-exact", 0.7, None),
                                              ("dirichlet-release-count", 0.3, 1.0)])
def test_never_below_the_exact_lower_bound(name, noise, alpha):
    from dpnoise.audit import pld

    mechanism = "dirichlet" if alpha else "penultimate-gaussian"
    q, steps, delta = 0.02, 100, 1e-6
    value = route_epsilon(name, noise, q, steps, delta, **({"alpha": alpha} if alpha else {}))
    bound = pld.lower_bound(mechanism, noise, q, steps, delta, alpha=alpha, grid=1 << 16).epsilon
    assert bound <= value
    if alpha is None:  # the exact profile: the lower bound's discretisation is all that separates them
        assert bound >= 0.97 * value


# -- the accountant --------------------------------------------------------------------------------
def test_a_ledger_of_several_events_gets_no_number_and_the_default_falls_back():
    acc = get_accountant("penultimate-gaussian").step(noise_multiplier=1.0, sample_rate=0.01, steps=100)
    acc.step(noise_multiplier=2.0, sample_rate=0.01, steps=100)
    by_route = acc.epsilon_by_route(1e-5)
    assert by_route["penultimate-gaussian-exact"][0] == math.inf
    assert "2 different events" in by_route["penultimate-gaussian-exact"][1]
    epsilon, bound = acc.get_epsilon_and_bound(1e-5)
    assert bound.startswith("penultimate-gaussian-replace-one-rdp") and math.isfinite(epsilon)
    route = get_accountant("penultimate-gaussian-exact")
    route._history = acc.history  # noqa: SLF001
    assert route.get_delta(1.0) == 1.0


def test_one_event_split_over_several_entries_is_one_repeated_release():
    event = PoissonSampledEvent(0.05, GaussianEvent(0.5))
    split = get_accountant("penultimate-gaussian-exact").compose(event, 30).compose(GaussianEvent(3.0), 0)
    split.compose(event, 20)
    whole = get_accountant("penultimate-gaussian-exact").compose(event, 50)
    assert split.get_epsilon(1e-6) == whole.get_epsilon(1e-6)


def test_delta_and_epsilon_are_consistent():
    acc = get_accountant("dirichlet-release-count").step(concentration=0.2, sample_rate=0.01, steps=1000, alpha=1.0)
    eps = acc.get_epsilon(1e-7)
    assert acc.get_delta(eps) <= 1e-7 * (1 + 1e-6)
    assert acc.get_delta(eps * 0.99) > 1e-7
    pen = get_accountant("penultimate-gaussian-exact").step(noise_multiplier=1.0, sample_rate=0.05, steps=20)
    weights = mp_binomial_weights(20, 0.05, 20)
    exact = mpmath.fsum(weights[k] * mp_gdp_delta(1.0, 2 * math.sqrt(k)) for k in range(1, 21))
    assert float(exact) <= pen.get_delta(1.0) <= float(exact) * (1 + 1e-9)


def test_state_dict_round_trip():
    acc = get_accountant("dirichlet-release-count").step(concentration=0.1, sample_rate=0.01, steps=500, alpha=2.0)
    restored = get_accountant("dirichlet-release-count")
    restored.load_state_dict(acc.state_dict())
    assert restored.history == acc.history and restored.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    with pytest.raises(InvalidParameterError, match="not 'penultimate-gaussian-exact'"):
        get_accountant("penultimate-gaussian-exact").load_state_dict(acc.state_dict())


def test_bad_inputs_are_refused():
    with pytest.raises(InvalidParameterError, match="orders= applies to RDP accountants only"):
        get_accountant("penultimate-gaussian-exact", orders=np.array([2.0]))
    with pytest.raises(InvalidParameterError, match="is of kind .rdp., accounted by RdpAccountant, not ReleaseCountAccountant"):
        ReleaseCountAccountant("dirichlet-rdp")
    acc = get_accountant("penultimate-gaussian-exact").step(noise_multiplier=1.0, sample_rate=0.01, steps=10)
    for delta in (0.0, 1.0, float("nan"), -1e-5):
        with pytest.raises(InvalidParameterError, match="delta"):
            acc.get_epsilon(delta)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        acc.get_delta(-1.0)
    with pytest.raises(InvalidParameterError, match="concentration"):
        get_accountant("dirichlet-release-count").step(concentration=-0.1, sample_rate=0.01)
    with pytest.raises(InvalidParameterError):
        release_counts(0, 0.5, -50.0)


@pytest.mark.parametrize("noise", [1e-300, 1e-30, 1e6, 1e300])
@pytest.mark.parametrize("q,steps", [(1e-9, 10**7), (0.5, 10**6), (1.0, 1)])
def test_extreme_inputs_give_an_upper_bound(noise, q, steps):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = route_epsilon("penultimate-gaussian-exact", noise, q, steps, 1e-12)
    rdp = route_epsilon("penultimate-gaussian-replace-one-rdp", noise, q, steps, 1e-12)
    assert value >= 0 and not math.isnan(value) and value <= rdp * (1 + 1e-9) + 1e-12
    if noise <= 1e-30 and q * steps >= 1:  # no noise: no privacy
        assert value > 1e50
