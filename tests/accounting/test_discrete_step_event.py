"""Secure mode's discrete Gaussian as a DP event: every accountant of a ledger holding it reports the release's
epsilon, correcting the whole ledger once (docs/theory/secure_noise.md §3.3)."""

import math

import pytest

from dpnoise.accounting import get_accountant
from dpnoise.accounting.events import (
    DiscreteGaussianStepEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
)
from dpnoise.accounting.secure_noise import SMOOTHING, smoothing_log_ratio
from dpnoise.accounting.validation import InvalidParameterError

STEP = PoissonSampledEvent(0.01, GaussianEvent(1.0))
#: a narrow rounding (1 grid step) on many coordinates: L ~ 1 over 100 steps, a correction large enough to see
COORDINATES, SMOOTHING_STEPS, STEPS = 1_000_000, 1, 100
DISCRETE = DiscreteGaussianStepEvent(STEP, COORDINATES, SMOOTHING_STEPS)
KINDS = ["gaussian-rdp", "gaussian-pld", "gaussian"]


def test_the_event_round_trips_and_checks_its_fields():
    assert event_from_dict(event_to_dict(DISCRETE)) == DISCRETE
    nested = SelfComposedEvent(DiscreteGaussianStepEvent(STEP, 10, SMOOTHING), 3)
    assert event_from_dict(event_to_dict(nested)) == nested
    for coordinates, smoothing in ((0, 4), (10, 0), (1.5, 4)):
        with pytest.raises(InvalidParameterError):
            DiscreteGaussianStepEvent(STEP, coordinates, smoothing)


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_every_kind_reports_the_corrected_epsilon_of_its_continuous_ledger(name, delta):
    continuous = get_accountant(name).compose(STEP, STEPS)
    released = get_accountant(name).compose(DISCRETE, STEPS)
    log_ratio = smoothing_log_ratio(STEPS, COORDINATES, SMOOTHING_STEPS)
    assert 0.5 < log_ratio < 5
    expected = continuous.get_epsilon(delta * math.exp(-log_ratio)) + 2 * log_ratio
    assert released.get_epsilon(delta) >= expected
    assert released.get_epsilon(delta) == pytest.approx(expected, rel=1e-9)
    assert released.steps == continuous.steps == STEPS
    assert released.get_quick_epsilon(delta) >= released.get_epsilon(delta)
    assert released.get_quick_epsilon(delta) == pytest.approx(
        continuous.get_quick_epsilon(delta * math.exp(-log_ratio)) + 2 * log_ratio, rel=1e-9)


@pytest.mark.parametrize("name", KINDS)
def test_delta_of_a_release_is_e_to_the_l_times_the_continuous_delta_below_2l(name):
    continuous = get_accountant(name).compose(STEP, STEPS)
    released = get_accountant(name).compose(DISCRETE, STEPS)
    log_ratio = smoothing_log_ratio(STEPS, COORDINATES, SMOOTHING_STEPS)
    epsilon = 2 * log_ratio + 2.0
    assert released.get_delta(epsilon) >= math.exp(log_ratio) * continuous.get_delta(2.0) * (1 - 1e-9)
    assert released.get_delta(epsilon) <= min(1.0, math.exp(log_ratio) * continuous.get_delta(2.0) * (1 + 1e-9))
    assert released.get_delta(2 * log_ratio) == 1.0


def test_a_minimum_corrects_its_routes_minimum_once():
    minimum = get_accountant("gaussian").compose(DISCRETE, STEPS)
    routes = [get_accountant(route).compose(DISCRETE, STEPS) for route in minimum.spec.routes]
    epsilon, bound = minimum.get_epsilon_and_bound(1e-5)
    assert epsilon == min(route.get_epsilon(1e-5) for route in routes)
    assert "discrete Gaussian's correction" in bound


def test_only_the_discrete_steps_count_in_the_correction():
    release = GaussianEvent(5.0)  # e.g. noisy statistics of the data, released once before training
    mixed = get_accountant("gaussian-rdp").compose(release).compose(DISCRETE, STEPS)
    continuous = get_accountant("gaussian-rdp").compose(release).compose(STEP, STEPS)
    log_ratio = smoothing_log_ratio(STEPS, COORDINATES, SMOOTHING_STEPS)
    assert mixed.get_epsilon(1e-5) == pytest.approx(
        continuous.get_epsilon(1e-5 * math.exp(-log_ratio)) + 2 * log_ratio, rel=1e-9)


@pytest.mark.parametrize("name", KINDS)
def test_a_ledger_of_discrete_steps_survives_its_state_dict(name):
    released = get_accountant(name).compose(DISCRETE, STEPS)
    restored = get_accountant(name)
    restored.load_state_dict(released.state_dict())
    assert restored.history == released.history
    assert restored.get_epsilon(1e-5) == released.get_epsilon(1e-5)


def test_a_ledger_without_discrete_steps_is_unchanged():
    assert get_accountant("gaussian").compose(STEP, STEPS).get_epsilon(1e-5) == \
        get_accountant("gaussian-pld").compose(STEP, STEPS).get_epsilon(1e-5)
