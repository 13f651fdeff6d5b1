"""A curve that no valid bound can have raises; it never becomes an epsilon."""

import numpy as np
import pytest

from dpnoise.accounting import get_accountant
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError, checked_rdp_curve, monotone_envelope
from dpnoise.accounting.rdp.registry import _RDP_ROUTES, _mechanism_rdp
from dpnoise.accounting.events import GaussianEvent
from dpnoise.errors import DpnoiseError

ORDERS = np.array([1.5, 2.0, 2.5, 3.0, 8.0])


@pytest.mark.parametrize(
    "curve,message",
    [
        ([0.1, 0.2, np.nan, 0.3, 0.4], "NaN"),
        ([0.1, 0.2, -0.01, 0.3, 0.4], "< 0"),
        ([0.0, 0.62, 0.41, 0.7, 0.8], "decreases from 0.62 at order 2 to 0.41 at order 2.5"),
    ],
)
def test_impossible_curves_raise(curve, message):
    with pytest.raises(InvalidPrivacyCurveError, match=message) as err:
        checked_rdp_curve(ORDERS, np.array(curve), "test")
    assert isinstance(err.value, DpnoiseError)


def test_valid_curves_pass_with_inf_and_rounding_level_negatives():
    curve = np.array([np.inf, 0.2, np.inf, 0.3, np.inf])  # +inf: no bound at that order
    np.testing.assert_array_equal(checked_rdp_curve(ORDERS, curve, "test"), curve)
    assert checked_rdp_curve(ORDERS, np.array([-1e-17, 0, 0, 1, 2]), "test")[0] == 0.0


def test_monotone_envelope_is_the_running_minimum_from_the_right():
    bound = np.array([0.5, 0.3, 0.4, 0.35, 1.0])
    np.testing.assert_array_equal(monotone_envelope(ORDERS, bound), [0.3, 0.3, 0.35, 0.35, 1.0])


def test_a_broken_rdp_function_is_refused_by_the_accountant():
    """The class of bug behind the Laplace-L1 under-report: a formula evaluated outside its domain."""
    def decreasing(event, q, orders):
        return 1.0 / np.asarray(orders)

    routes = _RDP_ROUTES[GaussianEvent]
    original = routes["add-remove"]
    try:
        routes["add-remove"] = decreasing
        _mechanism_rdp.cache_clear()
        with pytest.raises(InvalidPrivacyCurveError, match="decreases"):
            get_accountant("gaussian-rdp").step(noise_multiplier=0.9, sample_rate=0.01, steps=3).get_epsilon(1e-5)
    finally:
        routes["add-remove"] = original
        _mechanism_rdp.cache_clear()


def _pmfs(probs, infinity_mass=0.0, rho=0.0):
    from dpnoise.accounting.pld.tilted import GridPmf

    pmf = GridPmf(0, np.asarray(probs, dtype=float), infinity_mass, rho)
    return pmf, pmf


@pytest.mark.parametrize(
    "probs,infinity_mass,message",
    [
        ([0.5, np.nan, 0.5], 0.0, "NaN"),
        ([0.5, -0.1, 0.6], 0.0, "negative"),
        ([0.5, 0.4], 0.0, "total"),  # lost mass could hide privacy loss
        ([0.5, 0.5], -0.1, "infinity mass"),
        ([0.5, 0.5], 1.5, "infinity mass"),
    ],
)
def test_invalid_plds_raise(probs, infinity_mass, message):
    from dpnoise.accounting.pld.distribution import checked_pmfs

    with pytest.raises(InvalidPrivacyCurveError, match=message):
        checked_pmfs(_pmfs(probs, infinity_mass), "test")


@pytest.mark.parametrize("rho", [-1e-12, 0.5, np.nan])
def test_a_tail_error_out_of_range_raises(rho):
    from dpnoise.accounting.pld.distribution import checked_pmfs

    with pytest.raises(InvalidPrivacyCurveError, match="tail-sum error"):
        checked_pmfs(_pmfs([0.5, 0.5], 0.0, rho), "test")


def test_valid_pld_passes():
    from dpnoise.accounting.pld.distribution import checked_pmfs

    pmfs = _pmfs([0.25, 0.25, 0.5 - 1e-12], infinity_mass=1e-12, rho=1e-10)
    assert checked_pmfs(pmfs, "test") is pmfs
