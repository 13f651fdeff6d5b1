"""Adaptive clipping's step event (Andrew et al., arXiv 1905.03871): the gradient sum and the noisy count
released on one Poisson subsample, accounted as their joint release."""

import math

import numpy as np
import pytest

from dpnoise.accounting import calibrate, get_accountant
from dpnoise.accounting.adaptive_clipping import adaptive_step_event, count_event, joint_release
from dpnoise.accounting.events import ComposedEvent, GaussianEvent, Lap2Event, LaplaceEvent, PoissonSampledEvent
from dpnoise.accounting.rdp.composed import jointly_subsampled_rdp
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.rdp.orders import INTEGER_ORDERS
from dpnoise.accounting.validation import InvalidParameterError

Q, STEPS, DELTA = 0.01, 1000, 1e-5


def epsilon(accountant, event, steps=STEPS):
    return get_accountant(accountant).compose(event, steps).get_epsilon(DELTA)


def test_the_gaussian_pair_is_one_gaussian_and_matches_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    sigma, sigma_b = 1.0, 3.0
    step = adaptive_step_event(Q, GaussianEvent(sigma), count_event("gaussian", sigma_b))
    assert step.event == GaussianEvent((sigma ** -2 + sigma_b ** -2) ** -0.5)
    theirs = dp_accounting.rdp.RdpAccountant()
    theirs.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(sigma), dp_accounting.GaussianDpEvent(sigma_b)])), STEPS)
    assert epsilon("gaussian-rdp", step) == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-3)
    assert epsilon("gaussian", step) <= epsilon("gaussian-rdp", step)


def test_separate_subsampling_would_understate_the_joint_release():
    # why the pair is one subsampled event: at order 2, log(1 + q^2 (e^{R1+R2} - 1)) > the sum of the separate ones
    orders = np.array([2.0])
    joint = sampled_gaussian_rdp(0.5, (1 / 0.5 ** 2 + 1) ** -0.5, orders)
    separate = sampled_gaussian_rdp(0.5, 0.5, orders) + sampled_gaussian_rdp(0.5, 1.0, orders)
    assert joint[0] > separate[0]


@pytest.mark.parametrize("gradient", [LaplaceEvent(2.0), Lap2Event(2.0, 1000)])
def test_a_laplace_pair_is_one_laplace_mechanism(gradient):
    joint = joint_release(gradient, count_event("laplace", 4.0))
    if isinstance(gradient, LaplaceEvent):
        assert joint == LaplaceEvent(1 / (1 / 2.0 + 1 / 4.0))
    else:
        assert joint == Lap2Event(1 / math.hypot(1 / 2.0, 1 / 4.0), 1001)


@pytest.mark.parametrize("gradient,accountant", [(LaplaceEvent(2.0), "laplace-l1"), (Lap2Event(2.0, 1000), "lap2"),
                                                 (GaussianEvent(1.0), "gaussian")])
@pytest.mark.parametrize("law", ["gaussian", "laplace"])
def test_the_count_costs_something_and_nearly_nothing_under_huge_noise(gradient, accountant, law):
    if law == "laplace" and isinstance(gradient, GaussianEvent):
        pytest.skip("a Laplace count is for the Laplace mechanisms")
    alone = epsilon(accountant, PoissonSampledEvent(Q, gradient))
    with_count = epsilon(accountant, adaptive_step_event(Q, gradient, count_event(law, 5.0)))
    assert with_count > alone
    # a quiet count costs nearly nothing on the RDP route (the mixed pairs have no other); for the Laplace-L1 sum
    # with a Gaussian count the joint route's remove-direction lemma is a few percent looser than the exact
    # Laplace expansion
    route = f"{accountant}-rdp"
    alone = epsilon(route, PoissonSampledEvent(Q, gradient))
    quiet = epsilon(route, adaptive_step_event(Q, gradient, count_event(law, 1e6)))
    assert alone <= quiet <= alone * 1.05


def test_the_mixed_pair_is_a_composition_with_a_sound_rdp_route_only():
    step = adaptive_step_event(Q, LaplaceEvent(2.0), count_event("gaussian", 5.0))
    assert step.event == ComposedEvent((LaplaceEvent(2.0), GaussianEvent(5.0)))
    eps, bound = get_accountant("laplace-l1").compose(step, STEPS).get_epsilon_and_bound(DELTA)
    assert "laplace-l1-rdp" in bound and "no PLD for ComposedEvent" in bound
    # the joint route is at least the mechanisms' own subsampled RDP (it bounds the pair, which releases more)
    joint = jointly_subsampled_rdp(Q, (GaussianEvent(1.0), GaussianEvent(5.0)), INTEGER_ORDERS)
    assert np.all(joint >= sampled_gaussian_rdp(Q, (1 + 1 / 25) ** -0.5, INTEGER_ORDERS) * (1 - 1e-12))


def test_calibration_covers_the_count():
    count = count_event("gaussian", 2.0)
    fixed = calibrate("gaussian", 2.0, DELTA, Q, STEPS)
    adaptive = calibrate("gaussian", 2.0, DELTA, Q, STEPS, count_release=count)
    assert adaptive.noise > fixed.noise
    assert adaptive.epsilon <= 2.0
    assert epsilon("gaussian", adaptive_step_event(Q, GaussianEvent(adaptive.noise), count)) <= 2.0


def test_bad_count_noise_is_refused_by_name():
    with pytest.raises(InvalidParameterError, match="quantile_noise"):
        count_event("gaussian", -1.0)
    with pytest.raises(InvalidParameterError, match="quantile_noise_law"):
        count_event("uniform", 1.0)
