"""Property tests over the whole valid input domain: no accountant ever prints an epsilon below the truth.

Domain (extremes included): noise 1e-300..1e6, q 1e-9..1, steps 1..1e7, delta 1e-15..0.5,
params 1..1e12.  References, all computed here independently of the library:

* q = 1, one step, Laplace (laplace-l1, and lap2 with one parameter): the exact
  eps(delta) = C/b + 2 log(1 - delta) of the Laplace mechanism;
* q = 1, one step, Gaussian (gaussian; penultimate-gaussian at sigma/2): the analytic Gaussian
  mechanism of Balle & Wang 2018 (arXiv 1805.06530, Thm 8), solved here with SciPy;
* dp_accounting's PLD with optimistic rounding (a value at or below the truth) for gaussian and
  laplace-l1;
* lap2: the exact PLD lower bound of :mod:`dpnoise.audit.pld` for a one-coordinate and a spread
  shift;
* monotonicity (non-increasing in noise, non-decreasing in steps, q and 1/delta) and calibration
  (the returned noise reaches the target under a second, independent computation).

Hypothesis profiles (tests/conftest.py): "ci" (default, a few minutes at most) and "thorough".
"""

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import log_ndtr

from dpnoise.accounting import (
    ACCOUNTANTS,
    noise_keywords,
    UnreachableTargetError,
    UnsoundAccountantWarning,
    calibrate_dirichlet_r,
    calibrate_noise,
    get_accountant,
)
from dpnoise.accounting.rdp.orders import INTEGER_ORDERS

dp_accounting_pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
# test-only library: without it this module is skipped (dpnoise.accounting itself does not need it)
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
assume, example, given, settings = hypothesis.assume, hypothesis.example, hypothesis.given, hypothesis.settings

SOUND = ["gaussian", "laplace-l1", "lap2", "penultimate-gaussian", "dirichlet"]
ALL = [*SOUND, "lap2-paper"]
#: PLD grids make epsilon a step function of the inputs: monotone up to the discretisation.
PLD_SLACK = 2e-3
#: Calibrations run a root finder over PLDs: a third of the profile's examples.
FEWER = settings(max_examples=max(3, settings.default.max_examples // 3))


def log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda x: 10.0**x)


NOISE = log_uniform(1e-300, 1e6)
SAMPLE_RATE = st.one_of(log_uniform(1e-9, 1.0), st.just(1.0))
STEPS = st.one_of(log_uniform(1, 1e7).map(lambda x: max(1, int(x))), st.just(1))
DELTA = log_uniform(1e-15, 0.5)
PARAMS = log_uniform(1, 1e12).map(lambda x: max(1, int(x)))


def epsilon(name: str, noise: float, q: float, steps: int, delta: float, params: int = 1000, alpha: float = 1.0) -> float:
    kwargs = {"params": params} if name.startswith("lap2") else {}
    if name == "dirichlet":
        kwargs["alpha"] = alpha
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return get_accountant(name).step(sample_rate=q, steps=steps, **kwargs,
                                         **noise_keywords(ACCOUNTANTS[name].mechanism, noise)).get_epsilon(delta)


def laplace_exact_epsilon(shift: float, delta: float) -> float:
    """Laplace mechanism, shift C/b: delta(eps) = 1 - exp((eps - shift) / 2) on [0, shift]."""
    return max(0.0, shift + 2.0 * math.log1p(-delta))


def gaussian_exact_delta(eps: float, sigma: float) -> float:
    """Balle & Wang 2018, Thm 8: delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)."""
    a = log_ndtr(0.5 / sigma - eps * sigma)
    b = eps + log_ndtr(-0.5 / sigma - eps * sigma)
    return math.exp(a) * -math.expm1(b - a) if b < a else 0.0


def gaussian_exact_epsilon(sigma: float, delta: float) -> float:
    if gaussian_exact_delta(0.0, sigma) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_exact_delta(hi, sigma) > delta:
        hi *= 2.0
    return brentq(lambda e: gaussian_exact_delta(e, sigma) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)


# -- exact references at q = 1, one step -----------------------------------------------------------
@given(noise=log_uniform(1e-300, 1e6), delta=DELTA)
@example(noise=0.05, delta=1e-5)  # the reported under-estimate: 11.33 instead of ~20
def test_laplace_one_step_is_at_least_exact(noise, delta):
    exact = laplace_exact_epsilon(1.0 / noise, delta)
    assert epsilon("laplace-l1", noise, 1.0, 1, delta) >= exact * (1 - 1e-9)
    # A one-parameter Lap2 step is the same Laplace mechanism.
    assert epsilon("lap2", noise, 1.0, 1, delta, params=1) >= exact * (1 - 1e-9)


@given(noise=log_uniform(1e-3, 1e3), delta=DELTA)
@example(noise=1e-300, delta=1e-5)
@example(noise=1e6, delta=1e-5)
def test_gaussian_one_step_is_at_least_analytic_gaussian(noise, delta):
    exact = gaussian_exact_epsilon(noise, delta) if noise > 1e-100 else math.inf
    assert epsilon("gaussian", noise, 1.0, 1, delta) >= exact * (1 - 1e-7) - 1e-12
    # The penultimate-layer Gaussian moves a clipped activation by 2C: multiplier sigma / 2.
    exact_half = gaussian_exact_epsilon(noise / 2, delta) if noise > 1e-100 else math.inf
    assert epsilon("penultimate-gaussian", noise, 1.0, 1, delta) >= exact_half * (1 - 1e-7) - 1e-12


# -- dp_accounting's optimistic PLD: at or below the truth ------------------------------------------
def optimistic_pld_epsilon(kind: str, noise: float, q: float, steps: int, delta: float) -> float:
    build = dp_accounting_pld.from_gaussian_mechanism if kind == "gaussian" else dp_accounting_pld.from_laplace_mechanism
    pld = build(noise, pessimistic_estimate=False, value_discretization_interval=1e-4, sampling_prob=q)
    return pld.self_compose(steps).get_epsilon_for_delta(delta) if steps > 1 else pld.get_epsilon_for_delta(delta)


@given(kind=st.sampled_from(["gaussian", "laplace-l1"]), noise=log_uniform(0.3, 30), q=log_uniform(1e-4, 1.0),
       steps=log_uniform(1, 3000).map(int), delta=log_uniform(1e-10, 1e-2))
@example(kind="gaussian", noise=0.7928, q=258 / 60000, steps=5860, delta=1e-5)
@example(kind="laplace-l1", noise=0.4552, q=258 / 60000, steps=5860, delta=1e-5)
def test_at_least_dp_accountings_optimistic_pld(kind, noise, q, steps, delta):
    reference = optimistic_pld_epsilon("gaussian" if kind == "gaussian" else "laplace", noise, q, steps, delta)
    assert epsilon(kind, noise, q, steps, delta) >= reference - 1e-9


# -- lap2 against the exact lower bound of the audit --------------------------------------------------
@given(noise=log_uniform(0.3, 10), q=log_uniform(1e-3, 0.1), steps=log_uniform(1, 300).map(int),
       params=log_uniform(1, 1e4).map(int), delta=log_uniform(1e-8, 1e-3))
@example(noise=0.8, q=0.0043, steps=300, params=26010, delta=1e-5)
def test_lap2_at_least_exact_lower_bound(noise, q, steps, params, delta):
    from dpnoise.audit.pld import lower_bound

    claimed = epsilon("lap2", noise, q, steps, delta, params=params)
    for k in sorted({1, params}):  # one coordinate, and the shift spread over all n
        exact = lower_bound("lap2", noise, q, steps, delta, params=params, ks=[k], grid=1 << 14).epsilon
        assert claimed >= exact - 1e-9, f"k={k}: claimed {claimed} < exact lower bound {exact}"


# -- monotonicity over the whole domain, extremes included ------------------------------------------
@given(name=st.sampled_from(ALL), noise=NOISE, q=SAMPLE_RATE, steps=STEPS, delta=DELTA, params=PARAMS)
@example(name="gaussian", noise=1e-300, q=0.01, steps=100, delta=1e-5, params=1)
@example(name="gaussian", noise=1e308, q=0.01, steps=100, delta=1e-5, params=1)
@example(name="laplace-l1", noise=0.05, q=1.0, steps=1, delta=1e-5, params=1)
@example(name="lap2", noise=1.2, q=1.37e-4, steps=3299, delta=1e-6, params=10**12)
@example(name="dirichlet", noise=1e-300, q=1e-9, steps=10**7, delta=1e-12, params=1)
def test_epsilon_is_monotone(name, noise, q, steps, delta, params):
    if name == "dirichlet":  # r in (0, alpha): map the noise range onto r = alpha / (1 + noise)
        noise = 1.0 / (1.0 + noise)
    base = epsilon(name, noise, q, steps, delta, params)
    assert base >= 0 and not math.isnan(base)
    slack = PLD_SLACK * base + 1e-9 if math.isfinite(base) else 0.0
    more_private = noise * 0.8 if name == "dirichlet" else noise * 1.25
    assert epsilon(name, more_private, q, steps, delta, params) <= base + slack
    assert epsilon(name, noise, min(1.0, q * 1.5), steps, delta, params) >= base - slack
    assert epsilon(name, noise, q, steps * 2, delta, params) >= base - slack
    assert epsilon(name, noise, q, steps, delta / 10, params) >= base - slack


# -- calibration, checked by a second computation ---------------------------------------------------
@FEWER
@given(name=st.sampled_from(["gaussian", "laplace-l1", "penultimate-gaussian"]), target=log_uniform(0.05, 20),
       q=log_uniform(1e-4, 0.5), steps=log_uniform(1, 3000).map(int), delta=log_uniform(1e-10, 1e-2))
def test_calibrated_noise_reaches_target_under_dp_accounting(name, target, q, steps, delta):
    try:
        result = calibrate_noise(name, target, delta, q, steps, compare=False)
    except UnreachableTargetError:
        assume(False)
    kind, factor = {"gaussian": ("gaussian", 1.0), "laplace-l1": ("laplace", 1.0),
                    "penultimate-gaussian": ("gaussian", 0.5)}[name]
    assert result.epsilon <= target
    assert optimistic_pld_epsilon(kind, result.noise * factor, q, steps, delta) <= target + 1e-9


@FEWER
@given(target=log_uniform(0.05, 20), q=log_uniform(1e-4, 0.5), steps=log_uniform(1, 1000).map(int),
       params=log_uniform(1, 1e9).map(int), delta=log_uniform(1e-10, 1e-2))
def test_calibrated_lap2_reaches_target_under_a_second_computation(target, q, steps, params, delta):
    try:
        result = calibrate_noise("lap2", target, delta, q, steps, params=params, compare=False)
    except UnreachableTargetError:
        assume(False)
    # Independently: the RDP route on integer orders only, and the GDP route as dp_accounting's
    # optimistic PLD at noise multiplier 1/M_n with M_n from SciPy's normal quantile.
    from scipy.stats import norm

    rdp = get_accountant("lap2-rdp", orders=INTEGER_ORDERS).step(laplace_scale=result.noise, sample_rate=q, params=params, steps=steps)
    a = 1.0 / (result.noise * math.sqrt(params))
    mu = math.sqrt(params) * 2 * norm.isf(math.exp(-a / 2) / 2) if a > 1e-3 else math.sqrt(math.pi / 2) / result.noise
    gdp = optimistic_pld_epsilon("gaussian", 1.0 / mu, q, steps, delta)
    assert min(rdp.get_epsilon(delta), gdp) <= target + 1e-9


@given(target=log_uniform(0.5, 20), q=log_uniform(1e-3, 0.05), steps=log_uniform(10, 5000).map(int),
       alpha=log_uniform(0.2, 5))
def test_calibrated_dirichlet_r_reaches_target_under_a_second_computation(target, q, steps, alpha):
    try:
        result = calibrate_dirichlet_r(target, 1e-5, q, steps, alpha=alpha)
    except UnreachableTargetError:
        assume(False)
    # the default is the smaller of two routes: the RDP route on another order grid (the integers to 128
    # and real orders 1.6, 1.65, ..., 10.95, docs/theory/dirichlet.md Sec. 1.2), and the release-count route
    orders = np.union1d(np.round(np.arange(1.6, 11.0, 0.05), 10), np.arange(2.0, 129.0))
    step = dict(concentration=result.noise, sample_rate=q, alpha=alpha, steps=steps)
    second = min(get_accountant("dirichlet-rdp", orders=orders).step(**step).get_epsilon(1e-5),
                 get_accountant("dirichlet-release-count").step(**step).get_epsilon(1e-5))
    assert result.epsilon <= target and second <= target
