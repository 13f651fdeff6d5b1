"""The PLD routes at tiny delta: round-off bounded, never below exact values, fallback to RDP.

References computed here independently of the library: the exact Gaussian-DP profile at q = 1
(Dong, Roth & Su, arXiv 1905.02383: T Gaussian steps of multiplier sigma are sqrt(T)/sigma-GDP),
the exact Laplace profile, and lower bounds computed outside this library for q < 1.
"""

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import log_ndtr

from dpnoise.accounting import calibrate_noise, get_accountant
from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
from dpnoise.accounting.pld import distribution, tilted
from dpnoise.accounting.pld.gdp import lap2_gdp_mu
from dpnoise.accounting.pld.roundoff import fft_error_factor, power_product_entry_error
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError

DELTAS = [1e-3, 1e-5, 1e-8, 1e-10, 1e-12, 1e-15]


def gdp_log_delta(epsilon: float, mu: float) -> float:
    """log delta(eps) of mu-GDP: log[Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)], without cancellation."""
    a = log_ndtr(-epsilon / mu + mu / 2)
    b = epsilon + log_ndtr(-epsilon / mu - mu / 2)
    return a + math.log(-math.expm1(b - a)) if b < a else -math.inf


def gdp_epsilon(mu: float, delta: float) -> float:
    if gdp_log_delta(0.0, mu) <= math.log(delta):
        return 0.0
    hi = 1.0
    while gdp_log_delta(hi, mu) > math.log(delta):
        hi *= 2.0
    return brentq(lambda e: gdp_log_delta(e, mu) - math.log(delta), 0.0, hi, xtol=1e-13, rtol=1e-13)


def gaussian(name: str, sigma: float, q: float, steps: int, delta: float) -> tuple[float, str]:
    return get_accountant(name).step(noise_multiplier=sigma, sample_rate=q, steps=steps).get_epsilon_and_bound(delta)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("sigma,steps", [(0.8, 1), (2.0, 10), (8.0, 1000), (4.0, 1000), (30.0, 100_000)])
def test_gaussian_at_q1_is_at_least_exact_gdp(sigma, steps, delta):
    exact = gdp_epsilon(math.sqrt(steps) / sigma, delta)
    for name in ("gaussian", "gaussian-pld"):
        epsilon, bound = gaussian(name, sigma, 1.0, steps, delta)
        assert epsilon >= exact * (1 - 1e-12), f"{name}: {epsilon} < exact {exact} ({bound})"
    # Not vacuous: the default stays within 10% (+0.05) of the exact value.
    assert gaussian("gaussian", sigma, 1.0, steps, delta)[0] <= 1.1 * exact + 0.05


@pytest.mark.parametrize("delta", [1e-5, 1e-10, 1e-15])
@pytest.mark.parametrize("ratio,params,steps", [(0.5, 1, 100), (2.0, 26_010, 1000)])
def test_lap2_gdp_at_q1_is_at_least_its_exact_gdp(ratio, params, steps, delta):
    """At q = 1 the lap2-gdp route's own mechanism is exactly sqrt(T) M_n-GDP."""
    exact = gdp_epsilon(math.sqrt(steps) * lap2_gdp_mu(ratio, params), delta)
    acc = get_accountant("lap2-gdp").step(laplace_scale=ratio, clip=1.0, params=params, sample_rate=1.0, steps=steps)
    assert acc.get_epsilon(delta) >= exact * (1 - 1e-12)


@pytest.mark.parametrize("delta", [1e-5, 1e-12, 1e-15])
@pytest.mark.parametrize("ratio", [0.3, 2.0, 50.0])
def test_laplace_l1_one_step_is_at_least_exact_at_tiny_delta(ratio, delta):
    exact = max(0.0, 1.0 / ratio + 2.0 * math.log1p(-delta))
    for name in ("laplace-l1", "laplace-l1-pld"):
        acc = get_accountant(name).step(laplace_scale=ratio, clip=1.0, sample_rate=1.0)
        assert acc.get_epsilon(delta) >= exact * (1 - 1e-12)


@pytest.mark.parametrize("sigma,q,steps,lower_bound", [
    (8.0, 1.0, 1000, 35.0454),        # exact (GDP, q = 1)
    (4.0, 1.0, 1000, 86.1481),        # exact
    (2.0, 0.01, 100_000, 12.8997),    # lower bounds computed outside dpnoise
    (0.5, 0.3, 1000, 569.570),
    (5.0, 0.5, 10_000, 120.3612),
])
def test_reported_underestimates_at_delta_1e_12(sigma, q, steps, lower_bound):
    """dpnoise printed 35.0297, 86.1439, 12.7577, 569.4748 and 120.3518 for these settings."""
    epsilon, bound = gaussian("gaussian", sigma, q, steps, 1e-12)
    assert epsilon >= lower_bound, bound


def test_roundoff_bound_covers_the_fft_composition():
    """An FFT power composition against an exact-order reference (direct convolutions of
    nonnegative terms, relative error ~1e-13): every entry within the bound, which is not vacuous."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pmf = pld_lib.from_gaussian_mechanism(1.0, pessimistic_estimate=True, value_discretization_interval=0.02,
                                          sampling_prob=0.2)._pmf_remove.to_dense_pmf()
    probs, steps = np.asarray(pmf._probs), 40
    reference = probs
    for _ in range(steps - 1):
        reference = np.convolve(reference, probs)
    length = reference.size
    spectrum = np.fft.fft(probs, length)
    computed = np.fft.ifft(spectrum**steps).real
    bound = power_product_entry_error([np.abs(spectrum)], [steps], [fft_error_factor(length) * probs.sum()],
                                      spectrum**steps)
    actual = np.abs(computed - reference)
    assert 0 < actual.max() <= bound < 1e4 * actual.max()


def test_epsilon_and_delta_of_a_composed_pld_agree():
    history = ((PoissonSampledEvent(0.01, GaussianEvent(1.1)), 2000),)
    grid = distribution.COARSE_DISCRETIZATION
    for delta in [1e-4, 1e-8, 1e-11]:
        steps = distribution._directions(history, grid)
        composed = distribution.composed_pld(history, grid, tuple(tilted.tilt_for_delta(s, grid, delta) for s in steps))
        epsilon = composed.epsilon_for_delta(delta)
        assert composed.delta_for_epsilon(epsilon) <= delta
        # smallest to within the grid: a little less epsilon certifies less
        assert composed.delta_for_epsilon(max(epsilon - 1e-3, 0.0)) > delta


@pytest.mark.parametrize("sigma,steps", [(8.0, 1000), (1000.0, 10), (2.0, 10)])
def test_pld_certifies_delta_1e_15_within_a_percent_of_exact(sigma, steps):
    """The tilted composition keeps the round-off bound far below delta = 1e-15 (an untilted FFT's
    bound exceeds it and the RDP route, up to 5x the exact value, answered)."""
    exact = gdp_epsilon(math.sqrt(steps) / sigma, 1e-15)
    epsilon, bound = gaussian("gaussian", sigma, 1.0, steps, 1e-15)
    assert bound.startswith("gaussian-pld")
    assert exact <= epsilon <= 1.01 * exact


def test_gaussian_falls_back_where_no_pld_is_attempted():
    """More steps than the PLD route composes: the RDP route answers, with the PLD's reason."""
    epsilon, bound = gaussian("gaussian", 50.0, 1e-6, distribution.MAX_COMPOSITIONS + 1, 1e-5)
    assert bound.startswith("gaussian-rdp") and "PLD composition too costly" in bound
    assert math.isfinite(epsilon)


def test_invalid_pld_falls_back_to_rdp(monkeypatch):
    """A PLD that fails its checks makes the PLD route answer +inf with the reason; the default answers by RDP."""
    def invalid(pmfs, source):
        raise InvalidPrivacyCurveError(f"{source}: PLD has NaN or negative mass; refusing to report an epsilon")

    monkeypatch.setattr(distribution, "checked_pmfs", invalid)
    distribution.single_step_pmfs.cache_clear()
    distribution.pld_epsilon.cache_clear()
    try:
        epsilon, bound = gaussian("gaussian", 1.3, 0.02, 777, 1e-5)
        pld_epsilon, pld_bound = gaussian("gaussian-pld", 1.3, 0.02, 777, 1e-5)
    finally:
        distribution.single_step_pmfs.cache_clear()
        distribution.pld_epsilon.cache_clear()
    rdp_epsilon = gaussian("gaussian-rdp", 1.3, 0.02, 777, 1e-5)[0]
    assert epsilon == rdp_epsilon and bound.startswith("gaussian-rdp") and "NaN or negative mass" in bound
    assert pld_epsilon == math.inf and "PLD not valid" in pld_bound


def test_extreme_settings_of_the_issue_answer():
    """Settings where the PLD used to be refused ("PLD has NaN or negative mass")."""
    epsilon, bound = gaussian("gaussian", 0.5, 1e-6, 1_000_000, 1e-5)
    assert 0 < epsilon < gaussian("gaussian-rdp", 0.5, 1e-6, 1_000_000, 1e-5)[0] + 1e-12 and bound
    for params in (1, 1000, 10**6):
        acc = get_accountant("lap2").step(laplace_scale=0.5, clip=1.0, params=params, sample_rate=1e-6, steps=10**6)
        assert math.isfinite(acc.get_epsilon(1e-5))


def test_laplace_l1_calibrates_where_its_pld_used_to_be_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = calibrate_noise("laplace-l1", 0.5, 0.1, 1e-4, 100_000, compare=False)
    assert 0.49 < result.epsilon <= 0.5


def test_calibration_names_a_route_that_cannot_certify():
    """A route that answers +inf at every noise: the refusal says so, not that more noise would help."""
    from dpnoise.accounting import UnreachableTargetError

    with pytest.raises(UnreachableTargetError, match="certifies no finite epsilon at any noise"):
        calibrate_noise("gaussian-pld", 1.0, 1e-5, 1e-6, distribution.MAX_COMPOSITIONS + 1, compare=False)


@pytest.mark.parametrize("sigma,q,steps,delta,lower_bound", [
    (1.0, 1e-4, 100_000, 1e-12, 0.2178),   # the RDP route answered 1.4303
    (0.6, 1e-3, 100_000, 1e-8, 8.0),       # the RDP route answered 9.4326
])
def test_default_within_two_percent_of_dp_accountings_pld(sigma, q, steps, delta, lower_bound):
    """Where the untilted PLD could not certify delta, the default is now within 2% of dp_accounting's own
    pessimistic PLD at a 1e-4 grid (which bounds no round-off), and above a lower bound."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    reference = pld_lib.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4, sampling_prob=q
                                                ).self_compose(steps).get_epsilon_for_delta(delta)
    epsilon, bound = gaussian("gaussian", sigma, q, steps, delta)
    assert bound.startswith("gaussian-pld")
    assert lower_bound <= epsilon <= 1.02 * reference


def test_wide_single_steps_take_a_coarser_grid():
    """sigma = 0.05 at q = 1e-6: one step's loss support needs ~800,000 points at the 1e-3 grid; the
    route coarsens its grid instead of leaving the answer to the RDP route (372379.1)."""
    epsilon, bound = gaussian("gaussian", 0.05, 1e-6, 1000, 1e-5)
    assert bound.startswith("gaussian-pld")
    assert 222.15 <= epsilon <= 240.0


@pytest.mark.parametrize("mechanism,keywords,q,steps,bounded", [
    ("laplace-l1", dict(laplace_scale=0.5, clip=1.0), 1e-4, 10_000, (0, 1)),  # both directions' losses bounded
    ("gaussian", dict(noise_multiplier=0.6), 0.05, 1000, (1,)),               # the add direction's, at q < 1
])
def test_bounded_losses_hold_no_infinity_mass_at_delta_1e_15(mechanism, keywords, q, steps, bounded):
    """Where a direction's privacy loss has a supremum, its delta is exactly 0 beyond it: a rounding bound put
    there as infinity mass, times the steps, exceeded delta = 1e-15 and the RDP route answered."""
    accountant = get_accountant(mechanism).step(sample_rate=q, steps=steps, **keywords)
    epsilon, bound = accountant.get_epsilon_and_bound(1e-15)
    assert bound.startswith(f"{mechanism}-pld") and math.isfinite(epsilon)
    (event, _), = accountant.history
    pmfs = distribution.single_step_pmfs(event, distribution.COARSE_DISCRETIZATION)
    assert all(pmfs[direction].infinity_mass == 0.0 for direction in bounded)


@pytest.mark.parametrize("length", [12, 13])
def test_half_spectrum_power_composition_is_bounded_like_the_whole(length):
    """Powers taken on the entries k <= L/2 of a real input's spectrum and mirrored: the composition
    is within the bound computed from that half (entries counted with their multiplicity), which is
    the bound of the whole spectrum."""
    from dpnoise.accounting.pld.roundoff import mirror_multiplicity

    probs = np.array([0.5, 0.3, 0.2])
    steps = 4
    reference = probs
    for _ in range(steps - 1):
        reference = np.convolve(reference, probs)
    spectrum = np.fft.fft(probs, length)
    half = length // 2 + 1
    powers = spectrum[:half] ** steps
    computed = np.fft.ifft(np.concatenate([powers, np.conj(powers[1:length - half + 1][::-1])])).real
    forward = [fft_error_factor(length) * probs.sum()]
    half_bound = power_product_entry_error([np.abs(spectrum[:half])], [steps], forward, powers, length)
    whole_bound = power_product_entry_error([np.abs(spectrum)], [steps], forward, spectrum**steps)
    assert mirror_multiplicity(half, length).sum() == length
    assert half_bound == pytest.approx(whole_bound, rel=1e-6)
    assert np.max(np.abs(computed[:reference.size] - reference)) <= half_bound
