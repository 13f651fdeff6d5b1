"""The accountant object: composition, mixing mechanisms, warnings, state_dict, validation."""

import math
import warnings

import numpy as np
import pytest
from scipy import optimize, stats

from dpnoise.accounting import (
    ACCOUNTANTS,
    MECHANISMS,
    InvalidParameterError,
    RdpAccountant,
    UnsoundAccountantWarning,
    accountants_for_mechanism,
    get_accountant,
    noise_keywords,
)
from dpnoise.accounting.events import (
    ComposedEvent,
    GaussianEvent,
    Lap2Event,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
    to_dp_accounting,
)
from dpnoise.accounting.validation import check_count, check_delta, check_positive, check_sample_rate

# test-only library: without it this module is skipped (dpnoise.accounting itself does not need it);
# the Opacus cross-check imports Opacus in its own test
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
given, settings = hypothesis.given, hypothesis.settings


def test_gaussian_epsilon_matches_opacus_accountant():
    OpacusRDPAccountant = pytest.importorskip("opacus.accountants").RDPAccountant
    ours = get_accountant("gaussian-rdp").step(noise_multiplier=1.1, sample_rate=0.01, steps=3000)
    theirs = OpacusRDPAccountant()
    theirs.history = [(1.1, 0.01, 3000)]
    # Opacus uses a coarser order grid, so ours can only be lower (or equal).
    assert ours.get_epsilon(1e-5) <= theirs.get_epsilon(1e-5) + 1e-9
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=0.02)


def test_mechanisms_mix_in_one_accountant():
    acc = get_accountant("gaussian-rdp").step(noise_multiplier=1.0, sample_rate=0.01, steps=5).step(
        laplace_scale=2.0, sample_rate=0.02, mechanism="lap2", params=100, steps=3)
    g = get_accountant("gaussian-rdp").step(noise_multiplier=1.0, sample_rate=0.01, steps=5).get_rdp()
    l2 = get_accountant("lap2-rdp").step(laplace_scale=2.0, sample_rate=0.02, params=100, steps=3).get_rdp()
    np.testing.assert_allclose(acc.get_rdp(), g + l2)
    assert acc.steps == 8


def test_composed_event_equals_sum_of_parts():
    e1 = PoissonSampledEvent(0.01, GaussianEvent(1.0))
    e2 = PoissonSampledEvent(0.05, Lap2Event(0.9, 5000))
    a = RdpAccountant("lap2-rdp").compose(ComposedEvent((SelfComposedEvent(e1, 4), e2)))
    b = RdpAccountant("lap2-rdp").compose(e1, 4).compose(e2)
    np.testing.assert_allclose(a.get_rdp(), b.get_rdp())


def test_reported_accountants_for_lap2_are_sound_then_paper():
    assert accountants_for_mechanism("lap2") == ["lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"]
    assert ACCOUNTANTS["dirichlet"].scope and ACCOUNTANTS["penultimate-gaussian"].scope


def test_penultimate_gaussian_uses_half_the_noise_multiplier():
    pen = get_accountant("penultimate-gaussian-rdp").step(noise_multiplier=2.0, sample_rate=0.01, steps=100)
    gauss = get_accountant("gaussian-rdp").step(noise_multiplier=1.0, sample_rate=0.01, steps=100)
    np.testing.assert_allclose(pen.get_rdp(), gauss.get_rdp())


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["gaussian", "laplace-l1", "lap2", "dirichlet"]),
    noise=st.floats(0.3, 20),
    q=st.floats(1e-4, 1.0),
    steps=st.integers(0, 10**5),
)
def test_state_dict_round_trips(name, noise, q, steps):
    acc = get_accountant(name)
    kwargs = {"params": 123} if name == "lap2" else {"alpha": 2.0} if name == "dirichlet" else {}
    acc.step(sample_rate=q, steps=steps, **kwargs, **noise_keywords(name, noise))
    clone = get_accountant(name)
    clone.load_state_dict(acc.state_dict())
    assert clone.steps == acc.steps and clone.history == acc.history
    e1, e2 = acc.get_epsilon(1e-5), clone.get_epsilon(1e-5)
    assert e1 == e2 or (math.isinf(e1) and math.isinf(e2))


def test_event_serialisation_and_dp_accounting_interop():
    event = SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(2.0)), 5)
    assert event_from_dict(event_to_dict(event)) == event
    assert type(to_dp_accounting(event)).__name__ == "SelfComposedDpEvent"
    with pytest.raises(NotImplementedError):
        to_dp_accounting(Lap2Event(1.0, 10))


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(noise_multiplier=1.0, sample_rate=0.0), "sample_rate"),
        (dict(noise_multiplier=1.0, sample_rate=1.5), "sample_rate"),
        (dict(noise_multiplier=-1.0, sample_rate=0.1), "noise_multiplier"),
        (dict(noise_multiplier=0.0, sample_rate=0.1), "noise_multiplier"),
        (dict(noise_multiplier=float("nan"), sample_rate=0.1), "noise_multiplier"),
        (dict(noise_multiplier=float("inf"), sample_rate=0.1), "noise_multiplier"),
        (dict(noise_multiplier=1.0, sample_rate=float("nan")), "sample_rate"),
        (dict(noise_multiplier=1.0, sample_rate=0.1, steps=-1), "count"),
        (dict(laplace_scale=1.0, sample_rate=0.1, params=0, mechanism="lap2"), "params"),
        (dict(laplace_scale=1.0, sample_rate=0.1, params=2.5, mechanism="lap2"), "params"),
        (dict(laplace_scale=1.0, sample_rate=0.1, clip=0.0, mechanism="lap2", params=10), "clip"),
        (dict(concentration=0.5, sample_rate=0.1, alpha=-1.0, mechanism="dirichlet"), "alpha"),
    ],
)
def test_bad_step_input_names_the_parameter(kwargs, param):
    with pytest.raises(InvalidParameterError, match=param):
        get_accountant(kwargs.get("mechanism", "gaussian")).step(**kwargs)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_noise_in_another_unit_is_refused_naming_the_right_keyword(mechanism):
    """A noise is never read in the wrong unit: only the mechanism's own keyword is accepted."""
    own = MECHANISMS[mechanism].noise.keyword
    setting = {"sample_rate": 0.1, "params": 10, "alpha": 1.0}
    for keyword in {"noise_multiplier", "laplace_scale", "concentration"} - {own}:
        with pytest.raises(InvalidParameterError, match=f"{keyword} does not apply.*give {own}"):
            get_accountant(MECHANISMS[mechanism].default_accountant).step(**setting, **{keyword: 0.5})
    with pytest.raises(InvalidParameterError, match=f"{own} is required"):
        get_accountant(MECHANISMS[mechanism].default_accountant).step(**setting)
    with pytest.raises(TypeError):
        get_accountant(MECHANISMS[mechanism].default_accountant).step(0.5, 0.1)  # no unit-less positional noise


def test_every_registered_mechanism_has_sound_default_and_implementation_free_spec():
    for name, spec in MECHANISMS.items():
        assert accountants_for_mechanism(name)[0] == spec.default_accountant and ACCOUNTANTS[spec.default_accountant].sound
        assert all(ACCOUNTANTS[a].mechanism == name for a in spec.accountants)
        assert (spec.clip_norm_ord is not None) == spec.needs_per_sample_gradients


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="choose from"):
        get_accountant("laplace")
    with pytest.raises(ValueError, match="choose from"):
        get_accountant("gaussian").step(noise_multiplier=1.0, sample_rate=0.1, mechanism="cauchy")


def test_accounting_imports_without_torch():
    """dpnoise.accounting is pure NumPy/SciPy: importing it (and computing) loads no torch."""
    import subprocess
    import sys

    code = (
        "import sys; import dpnoise.accounting as a; "
        "a.get_accountant('lap2').step(laplace_scale=1.0, sample_rate=0.01, params=10, steps=3).get_epsilon(1e-5); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _exact_shared_inclusion_gaussian_delta(epsilon: float, mu: float, q: float, steps: int) -> float:
    """delta(epsilon) of T steps of the per-example Gaussian release under replace-one adjacency, exactly: the
    example is in K ~ Bin(T, q) steps, and K Gaussian releases of privacy-loss mean mu are a Gaussian of loss
    N(K mu, 2 K mu), whose delta is Phi(-eps/s + s/2) - e^eps Phi(-eps/s - s/2) with s = sqrt(2 K mu)."""
    k = np.arange(1, steps + 1)
    s = np.sqrt(2 * k * mu)
    per_k = stats.norm.cdf(-epsilon / s + s / 2) - np.exp(epsilon) * stats.norm.cdf(-epsilon / s - s / 2)
    return float(np.sum(stats.binom.pmf(k, steps, q) * per_k))


def test_penultimate_default_bounds_the_exact_replace_one_epsilon_which_refutes_the_add_remove_reading():
    """Each sampled example's activation, clipped to C, released with N(0, sigma^2 C^2): a replaced input moves it
    by up to 2C (privacy-loss mean mu = 2 / sigma^2 per release)."""
    sigma, q, steps, delta = 2.0, 0.00512, 5860, 1e-5
    exact = optimize.brentq(lambda e: _exact_shared_inclusion_gaussian_delta(e, 2 / sigma ** 2, q, steps) - delta, 0.1, 200)
    default = get_accountant("penultimate-gaussian").step(noise_multiplier=sigma, sample_rate=q, steps=steps)
    assert exact <= default.get_epsilon(delta) <= 1.3 * exact
    for reading in ("penultimate-gaussian-pld", "penultimate-gaussian-rdp"):
        with pytest.warns(UnsoundAccountantWarning, match="NOT a valid bound under replace-one"):
            claimed = get_accountant(reading).step(noise_multiplier=sigma, sample_rate=q, steps=steps).get_epsilon(delta)
        assert claimed < exact / 10, reading


def test_replace_one_release_equals_the_add_remove_bound_without_sampling():
    """At q = 1 every example's output is released every step: both readings are the Gaussian's RDP at sigma / 2."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        pen = get_accountant("penultimate-gaussian-replace-one-rdp").step(noise_multiplier=2.0, sample_rate=1.0, steps=3)
        reading = get_accountant("penultimate-gaussian-rdp").step(noise_multiplier=2.0, sample_rate=1.0, steps=3)
    np.testing.assert_allclose(pen.get_rdp(), reading.get_rdp(), rtol=1e-12)


# -------------------------------------------------- issue 22 part 6: the API's remaining input gaps
BAD_ORDERS = [[], [float("nan")], [float("inf")], [-3], ["a"], [1.0], [0.5], [2, 1.0], [True, 2], [[2, 3]], 5, "23"]


@pytest.mark.parametrize("orders", BAD_ORDERS, ids=repr)
def test_bad_orders_are_refused_naming_them(orders):
    for make in (lambda: get_accountant("gaussian-rdp", orders=orders), lambda: RdpAccountant("lap2-rdp", orders)):
        with pytest.raises(InvalidParameterError, match="orders") as caught:
            make()
        assert "\n" not in str(caught.value)


def test_given_orders_are_the_grid_the_epsilon_is_minimised_over():
    step = dict(noise_multiplier=1.0, sample_rate=0.01, steps=1000)
    few = get_accountant("gaussian-rdp", orders=(3, 2.5, 40)).step(**step)
    assert few.orders.tolist() == [3.0, 2.5, 40.0]
    epsilon, order = few.get_epsilon_and_order(1e-5)
    assert order in (3.0, 2.5, 40.0)
    assert epsilon >= get_accountant("gaussian-rdp").step(**step).get_epsilon(1e-5)  # a sub-grid of the default's


@pytest.mark.parametrize("check", [check_positive, check_sample_rate, check_delta, check_count])
@pytest.mark.parametrize("value", [True, False, np.True_])
def test_no_numeric_check_takes_a_bool(check, value):
    with pytest.raises(InvalidParameterError, match="the_parameter"):
        check("the_parameter", value)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("keyword", ["noise", "sample_rate", "clip", "params", "alpha", "steps"])
def test_no_step_argument_takes_a_bool(mechanism, keyword):
    spec = MECHANISMS[mechanism]
    keyword = spec.noise.keyword if keyword == "noise" else keyword
    arguments = {"sample_rate": 0.1, "params": 10, "clip": 1.0, "steps": 1, "mechanism": mechanism,
                 **({"alpha": 1.0} if "alpha" in spec.option_names() else {}), **noise_keywords(mechanism, 0.5),
                 keyword: True}
    named = {"steps": "count", "alpha": "alpha" if "alpha" in spec.option_names() else "alpha does not apply"}
    with pytest.raises(InvalidParameterError, match=named.get(keyword, keyword)):
        get_accountant(spec.default_accountant).step(**arguments)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_clip_params_and_alpha_are_checked_for_every_mechanism(mechanism):
    """Also where the event does not use them (the Gaussian's sigma is relative to C): as in make_private,
    a bad clipping norm or parameter count is refused, and alpha by a mechanism that does not take it."""
    spec = MECHANISMS[mechanism]
    acc = get_accountant(spec.default_accountant)
    takes_alpha = "alpha" in spec.option_names()
    setting = {"sample_rate": 0.1, "params": 10, **({"alpha": 1.0} if takes_alpha else {}),
               **noise_keywords(mechanism, 0.5)}
    for clip in (float("nan"), 0, 0.0, -1.0, float("inf")):
        with pytest.raises(InvalidParameterError, match="clip"):
            acc.step(**{**setting, "clip": clip})
    for params in (0, -5, 2.5, float("nan"), "10"):
        with pytest.raises(InvalidParameterError, match="params"):
            acc.step(**{**setting, "params": params})
    for alpha in (float("nan"), -1.0, 0.0):
        with pytest.raises(InvalidParameterError, match="alpha"):
            acc.step(**{**setting, "alpha": alpha})
    if not takes_alpha:
        with pytest.raises(InvalidParameterError, match="alpha does not apply"):
            acc.step(**setting, alpha=1.0)
    assert acc.history == []  # nothing was recorded


def _gaussian_entry(count, event=None):
    return {"event": event or {"type": "GaussianEvent", "noise_multiplier": 1.0}, "count": count}


@pytest.mark.parametrize("name, state, match", [
    ("gaussian", {"accountant": "gaussian"}, "no 'history'"),
    ("gaussian", None, "must be a dictionary"),
    ("gaussian", {"accountant": "gaussian", "history": [], "orders": [2.0]}, "unknown key 'orders'"),
    ("gaussian", {"accountant": "gaussian", "history": "abc"}, "history must be a list"),
    ("gaussian", {"accountant": "gaussian", "history": [{"event": {}}]}, r"history\[0\] must be"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(2.7)]}, r"history\[0\] count"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(2.0)]}, r"history\[0\] count"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry("10")]}, r"history\[0\] count"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(True)]}, r"history\[0\] count"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(-1)]}, r"history\[0\] count"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(1, {"type": "CauchyEvent"})]},
     "unknown DP event type 'CauchyEvent'"),
    ("gaussian", {"accountant": "gaussian", "history": [_gaussian_entry(1, "GaussianEvent")]}, "must be a dictionary"),
    ("gaussian", {"accountant": "gaussian", "history": [
        _gaussian_entry(1, {"type": "GaussianEvent", "noise_multiplier": 1.0, "clip": 1.0})]}, "fields"),
    ("gaussian", {"accountant": "gaussian", "history": [
        _gaussian_entry(1, {"type": "GaussianEvent", "noise_multiplier": "1"})]}, "noise_multiplier"),
    ("gaussian", {"accountant": "gaussian", "history": [
        _gaussian_entry(1, {"type": "ComposedEvent", "events": "ab"})]}, "events must be a list"),
    ("gaussian", {"accountant": "gaussian", "history": [
        _gaussian_entry(1, {"type": "DirichletEvent", "r": 0.5, "alpha": 1.0})]}, "DirichletEvent"),
    ("gaussian-rdp", {"accountant": "gaussian-rdp", "history": []}, "no 'orders'"),
    ("gaussian-rdp", {"accountant": "gaussian-rdp", "history": [], "orders": []}, "orders"),
    ("gaussian-rdp", {"accountant": "gaussian-rdp", "history": [], "orders": [float("nan")]}, "orders"),
])
def test_malformed_states_are_refused_and_change_nothing(name, state, match):
    acc = get_accountant(name).step(noise_multiplier=2.0, sample_rate=0.1, steps=7)
    before = acc.state_dict()
    with pytest.raises(InvalidParameterError, match=match) as caught:
        acc.load_state_dict(state)
    assert "\n" not in str(caught.value)
    assert acc.state_dict() == before


def test_a_state_round_trips_through_json():
    import json

    acc = get_accountant("gaussian-rdp", orders=[2, 8, 32]).step(noise_multiplier=1.0, sample_rate=0.1, steps=12)
    clone = get_accountant("gaussian-rdp")
    clone.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert clone.history == acc.history and clone.orders.tolist() == [2.0, 8.0, 32.0]
    assert clone.get_epsilon(1e-5) == acc.get_epsilon(1e-5)


def test_steps_count_the_poisson_sampled_events_only():
    """A full-batch step (q = 1) is a step; a mechanism event composed alone (a release of the data set) is not."""
    acc = get_accountant("gaussian-rdp").compose(GaussianEvent(8.0), 3)
    assert acc.steps == 0 and acc.get_epsilon(1e-5) > 0
    acc.step(noise_multiplier=1.0, sample_rate=1.0, steps=2).step(noise_multiplier=1.0, sample_rate=0.1, steps=5)
    assert acc.steps == 7


@pytest.mark.parametrize(("accountant", "mechanism"), [("gaussian", "penultimate-gaussian"),
                                                       ("dirichlet", "penultimate-gaussian"),
                                                       ("penultimate-gaussian", "gaussian")])
def test_an_output_mechanism_step_is_refused_by_another_mechanism_accountant(accountant, mechanism):
    """A penultimate-layer release is replace-one, a noisy gradient sum add/remove: both are GaussianEvents, so
    a gaussian accountant would under-report the release (4.77 where penultimate-gaussian gives 23.2 at q 0.05,
    200 steps, sigma 2); the mechanism is refused by name before anything is composed."""
    acc = get_accountant(accountant)
    with pytest.raises(InvalidParameterError, match=f"accounts the .* mechanism, not {mechanism}"):
        acc.step(mechanism=mechanism, noise_multiplier=2.0, sample_rate=0.05, steps=200)
    assert acc.steps == 0
