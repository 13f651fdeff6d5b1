"""Property tests: monotonicity, calibrators never overshoot, extreme inputs stay finite or fail clearly."""

import math
import warnings

import numpy as np
import pytest

from dpnoise.accounting import (
    ACCOUNTANTS,
    noise_keywords,
    InvalidParameterError,
    UnreachableTargetError,
    UnsoundAccountantWarning,
    calibrate_dirichlet_r,
    calibrate_lap2,
    calibrate_noise,
    get_accountant,
)

# test-only library: without it this module is skipped (dpnoise.accounting itself does not need it)
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
given, settings = hypothesis.given, hypothesis.settings

MECHS = {
    "gaussian": {},
    "laplace-l1": {},
    "lap2": {"params": 26010},
    "lap2-paper": {"params": 26010},
    "dirichlet": {"alpha": 1.0},
}


def epsilon(name, noise, q, steps, delta=1e-5):
    mechanism = ACCOUNTANTS[name].mechanism
    acc = get_accountant(name).step(sample_rate=q, steps=steps, **MECHS[name], **noise_keywords(mechanism, noise))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return acc.get_epsilon(delta)


def noise_strategy(name):
    return st.floats(0.01, 0.9) if name == "dirichlet" else st.floats(0.3, 30)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(MECHS)), data=st.data(), q=st.floats(1e-4, 0.5), steps=st.integers(1, 20000))
def test_epsilon_monotone(name, data, q, steps):
    noise = data.draw(noise_strategy(name))
    base = epsilon(name, noise, q, steps)
    tol = 1e-9 * (1 + base)
    # Dirichlet: larger r is less private; the others: larger noise is more private.
    more_private = noise * 0.8 if name == "dirichlet" else noise * 1.25
    assert epsilon(name, more_private, q, steps) <= base + tol
    assert epsilon(name, noise, min(1.0, q * 1.5), steps) >= base - tol
    assert epsilon(name, noise, q, steps * 2) >= base - tol


@settings(max_examples=8, deadline=None)  # each example runs PLD root finders
@given(
    name=st.sampled_from(["gaussian", "laplace-l1", "lap2"]),
    target=st.floats(0.2, 10),
    q=st.floats(1e-3, 0.2),
    steps=st.integers(10, 6000),
)
def test_noise_calibration_never_overshoots(name, target, q, steps):
    try:
        result = calibrate_noise(name, target, 1e-5, q, steps, params=MECHS[name].get("params"), compare=False)
    except UnreachableTargetError:
        return
    assert result.epsilon <= target
    assert epsilon(name, result.noise, q, steps) <= target
    # ... and is tight: 0.1% less noise breaks the target.
    assert epsilon(name, result.noise * 0.999, q, steps) > target * (1 - 1e-6)


@settings(max_examples=15, deadline=None)
@given(target=st.floats(0.5, 10), q=st.floats(1e-3, 0.05), epochs=st.integers(1, 40), alpha=st.floats(0.2, 5))
def test_dirichlet_calibration_never_overshoots(target, q, epochs, alpha):
    steps = math.ceil(epochs / q)
    try:
        result = calibrate_dirichlet_r(target, 1e-5, q, steps, alpha=alpha)
    except UnreachableTargetError:
        return
    assert 0 < result.noise < alpha
    acc = get_accountant("dirichlet").step(concentration=result.noise, sample_rate=q, steps=steps, alpha=alpha)
    assert acc.get_epsilon(1e-5) <= target


def test_lap2_algorithm1_scales_with_clip_and_reports_both_accountants():
    a = calibrate_lap2(1.0, 1e-5, 0.0043, 5860, 26010, clip=1.0)
    b = calibrate_lap2(1.0, 1e-5, 0.0043, 5860, 26010, clip=0.1)
    assert b.noise == pytest.approx(0.1 * a.noise, rel=1e-9)
    assert set(a.epsilon_by_accountant) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    assert a.epsilon_by_accountant["lap2"] <= 1.0


@pytest.mark.parametrize("name", sorted(MECHS))
@pytest.mark.parametrize("noise,q,steps", [(1e-3, 1.0, 1), (1e3, 1e-9, 10**9), (0.05, 0.999, 10**6), (50.0, 1.0, 1)])
def test_extreme_inputs_give_numbers(name, noise, q, steps):
    if name == "dirichlet":
        noise = min(noise, 0.5)
    value = epsilon(name, noise, q, steps)
    assert value >= 0 and not math.isnan(value)


@pytest.mark.parametrize("n", [1, 2, 10**12])
def test_lap2_params_extremes(n):
    acc = get_accountant("lap2").step(laplace_scale=1.0, sample_rate=0.01, params=n, steps=100)
    assert np.isfinite(acc.get_epsilon(1e-5))


def test_unreachable_gaussian_target_names_epsilon():
    """Any epsilon > 0 is reachable by enough Gaussian noise, unless releases before training spend it."""
    from dpnoise.accounting.events import GaussianEvent

    assert calibrate_noise("gaussian", 0.001, 1e-5, 0.5, 10**5, compare=False).epsilon <= 0.001
    with pytest.raises(UnreachableTargetError, match="epsilon=0.001 is unreachable: the releases before training"):
        calibrate_noise("gaussian", 0.001, 1e-5, 0.5, 10**5, releases=[GaussianEvent(10.0)])


@pytest.mark.parametrize("bad", [dict(target_epsilon=-1.0), dict(target_epsilon=float("nan")), dict(delta=1.0), dict(sample_rate=2.0), dict(steps=0)])
def test_calibration_rejects_bad_input(bad):
    args = dict(target_epsilon=1.0, delta=1e-5, sample_rate=0.01, steps=100) | bad
    with pytest.raises(InvalidParameterError):
        calibrate_noise("gaussian", **args)
