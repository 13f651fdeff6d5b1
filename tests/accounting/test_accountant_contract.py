"""The contract every registered accountant keeps, as dp_accounting's privacy_accountant_test.py:
the empty ledger, composition, state_dict round trips, refusals, the sound flag and the quick epsilon.

It runs over :data:`~dpnoise.accounting.ACCOUNTANTS`, so an accountant added by
``register_accountant`` runs it with no test of its own (the toy mechanism at the end shows it).
Each accountant sees a moderate setting of its own mechanism (q = 0.02, a few hundred steps);
PLD accountants cost a few tenths of a second a query, so each check asks few epsilons.
"""

import json
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest

from dpnoise.accounting import (
    ACCOUNTANTS,
    MECHANISMS,
    InvalidParameterError,
    RunFacts,
    UnsoundAccountantWarning,
    get_accountant,
    get_mechanism_spec,
    noise_keywords,
    register_plugin,
)
from dpnoise.accounting.events import EVENT_TYPES, PoissonSampledEvent
from dpnoise.accounting.rdp.registry import rdp_routes
import toy_mechanism as toy

SAMPLE_RATE, STEPS, DELTA = 0.02, 300, 1e-5
#: a noise of moderate epsilon (about 1 to 25 here) in each unit
NOISE = {"noise_multiplier": 1.0, "laplace_scale": 1.0, "concentration": 0.5, "toy_std": 1.0}
#: Lap2's number of trained parameters; two classes, so that the Dirichlet PLD route applies
PARAMS, NUM_CLASSES = 1000, 2


def step_arguments(name: str) -> dict:
    """The keyword arguments of ``step`` for one training step of the accountant's mechanism."""
    spec = get_mechanism_spec(ACCOUNTANTS[name].mechanism)
    return {"sample_rate": SAMPLE_RATE, **noise_keywords(spec.name, NOISE[spec.noise.keyword]),
            "params": PARAMS if spec.needs_params else None,
            "num_classes": NUM_CLASSES if "num_classes" in spec.option_names() else None}


def step_event(name: str) -> PoissonSampledEvent:
    """The same step as a DP event, built by the mechanism's registry entry."""
    spec = get_mechanism_spec(ACCOUNTANTS[name].mechanism)
    options = spec.make_options(num_classes=NUM_CLASSES if "num_classes" in spec.option_names() else None)
    event = spec.build_event(NOISE[spec.noise.keyword], options,
                             RunFacts(params=PARAMS if spec.needs_params else None))
    return PoissonSampledEvent(SAMPLE_RATE, event)


@contextmanager
def quiet():
    """Unsound accountants' warnings off (the sound-flag check records them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        yield


def composed(name: str, count: int = STEPS):
    return get_accountant(name).compose(step_event(name), count)


# ---------------------------------------------------------------------------------- the contract
def check_empty_ledger(name: str) -> None:
    """No step (also zero repetitions of one): epsilon 0 at every delta, delta 0 at every epsilon."""
    for acc in (get_accountant(name), get_accountant(name).compose(step_event(name), 0)):
        with quiet():
            assert acc.history == [] and acc.steps == 0
            assert acc.get_epsilon(DELTA) == 0.0 and acc.get_epsilon_and_bound(0.5) == (0.0, "no steps")
            assert acc.get_delta(1.0) == 0.0


def check_epsilon_is_finite_and_monotone(name: str) -> None:
    """Finite and > 0 after some steps; more steps never less epsilon; a larger delta never more."""
    acc, twice = composed(name), composed(name, 2 * STEPS)
    with quiet():
        epsilon = acc.get_epsilon(DELTA)
        assert 0 < epsilon < math.inf
        assert twice.get_epsilon(DELTA) >= epsilon
        assert acc.get_epsilon(DELTA / 100) >= epsilon >= acc.get_epsilon(DELTA * 100)
    assert acc.steps == STEPS and twice.steps == 2 * STEPS


def check_composition_is_additive(name: str) -> None:
    """a then b repetitions are a + b repetitions; k single steps are one step of k (what a checkpoint's
    ledger check assumes), and the event ``step`` builds is the mechanism's registered event."""
    split, whole = composed(name, STEPS // 3).compose(step_event(name), STEPS - STEPS // 3), composed(name)
    assert split.state_dict() == whole.state_dict()
    with quiet():
        assert split.get_epsilon(DELTA) == whole.get_epsilon(DELTA)
    one_by_one, at_once = get_accountant(name), get_accountant(name).step(**step_arguments(name), steps=10)
    for _ in range(10):
        one_by_one.step(**step_arguments(name))
    assert one_by_one.state_dict() == at_once.state_dict() == composed(name, 10).state_dict()


def check_state_dict_round_trips(name: str) -> None:
    """A fresh accountant loading the state (through JSON) holds the same ledger and epsilon; the state
    of another accountant, even one of the same mechanism, is refused and changes nothing."""
    acc = composed(name)
    state = acc.state_dict()
    clone = get_accountant(name)
    clone.load_state_dict(json.loads(json.dumps(state)))
    assert clone.state_dict() == state and clone.history == acc.history
    with quiet():
        assert clone.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    same_mechanism = [n for n in ACCOUNTANTS if n != name and ACCOUNTANTS[n].mechanism == ACCOUNTANTS[name].mechanism]
    other = (same_mechanism or [n for n in ACCOUNTANTS if n != name])[0]
    with pytest.raises(InvalidParameterError, match=f"state is for accountant '{other}', not '{name}'"):
        clone.load_state_dict(composed(other).state_dict())
    assert clone.state_dict() == state


BAD_DELTAS = [0.0, 1.0, -1.0, float("nan"), 1.5, -1e-5]


def check_bad_input_is_refused(name: str) -> None:
    """delta outside (0, 1), also with no steps; a negative epsilon or repetition count: one error
    naming the parameter, and the ledger unchanged."""
    for acc in (get_accountant(name), composed(name)):
        before = acc.state_dict()
        with quiet():
            for delta in BAD_DELTAS:
                for query in (acc.get_epsilon, acc.get_epsilon_and_bound, acc.get_quick_epsilon):
                    with pytest.raises(InvalidParameterError, match="delta"):
                        query(delta)
            for epsilon in (-1.0, float("nan")):
                with pytest.raises(InvalidParameterError, match="epsilon"):
                    acc.get_delta(epsilon)
        with pytest.raises(InvalidParameterError, match="count"):
            acc.compose(step_event(name), -1)
        with pytest.raises(InvalidParameterError, match="count"):
            acc.step(**step_arguments(name), steps=-1)
        assert acc.state_dict() == before


@dataclass(frozen=True)
class UnaccountableEvent:
    """A mechanism event no accountant knows (no RDP, PLD or release-count route is registered for it)."""

    noise_multiplier: float


def check_an_event_it_cannot_account_is_refused(name: str) -> None:
    """Refused when composed, not at the first query: one error naming the event type, ledger unchanged."""
    acc = composed(name)
    before = acc.state_dict()
    with pytest.raises(InvalidParameterError, match="UnaccountableEvent"):
        acc.compose(PoissonSampledEvent(SAMPLE_RATE, UnaccountableEvent(1.0)))
    assert acc.state_dict() == before


def check_sound_flag(name: str) -> None:
    """A sound accountant never warns; an unsound one warns with its registered warning on every number."""
    acc, spec = composed(name), ACCOUNTANTS[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc.get_epsilon(DELTA)
        acc.get_delta(1.0)
    unsound = [str(w.message) for w in caught if issubclass(w.category, UnsoundAccountantWarning)]
    assert acc.sound == spec.sound
    assert unsound == ([] if spec.sound else [spec.warning, spec.warning])


def check_quick_epsilon_bounds_the_epsilon(name: str) -> None:
    """The cheap per-step epsilon is never below the accountant's epsilon (it stands for it in budget checks)."""
    acc = composed(name)
    with quiet():
        assert acc.get_quick_epsilon(DELTA) >= acc.get_epsilon(DELTA)


CONTRACT = [
    check_empty_ledger,
    check_epsilon_is_finite_and_monotone,
    check_composition_is_additive,
    check_state_dict_round_trips,
    check_bad_input_is_refused,
    check_an_event_it_cannot_account_is_refused,
    check_sound_flag,
    check_quick_epsilon_bounds_the_epsilon,
]


@pytest.mark.parametrize("name", list(ACCOUNTANTS))
@pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__.removeprefix("check_"))
def test_every_accountant_keeps_the_contract(check, name):
    check(name)


# ------------------------------------------------ a new mechanism and its accountants, registered here
@pytest.fixture
def toy_mechanism():
    """The toy mechanism of tests/toy_mechanism.py, registered by one call; every registry as before afterwards."""
    before = (list(MECHANISMS), list(ACCOUNTANTS), dict(EVENT_TYPES))
    with toy.registered():
        yield list(toy.ACCOUNTANT_NAMES)
    assert (list(MECHANISMS), list(ACCOUNTANTS), dict(EVENT_TYPES)) == before


@pytest.mark.parametrize("check", CONTRACT, ids=lambda check: check.__name__.removeprefix("check_"))
def test_a_newly_registered_mechanism_runs_the_contract(toy_mechanism, check):
    assert list(ACCOUNTANTS)[-4:] == list(toy.ACCOUNTANT_NAMES)  # a minimum before its routes
    for name in toy_mechanism:
        check(name)


def test_the_toy_accountants_are_the_gaussian_ones_under_other_names(toy_mechanism):
    with quiet():
        epsilons = {name: get_accountant(name).step(toy_std=2.6, group_size=2, sample_rate=0.05, steps=200)
                    .get_epsilon(DELTA) for name in toy_mechanism}
    gaussian = {name: get_accountant(name).step(noise_multiplier=1.3, sample_rate=0.05, steps=200).get_epsilon(DELTA)
                for name in ("gaussian", "gaussian-pld", "gaussian-rdp")}
    assert [epsilons["toy"], epsilons["toy-pld"], epsilons["toy-rdp"]] == list(gaussian.values())
    assert epsilons["toy-rdp-unsound"] == gaussian["gaussian-rdp"]


def test_a_plugin_that_does_not_fit_is_refused_and_leaves_every_registry_as_it_was():
    before = (list(MECHANISMS), list(ACCOUNTANTS), dict(EVENT_TYPES), rdp_routes(toy.ToyEvent))
    broken = replace(toy.PLUGIN, accountants=toy.PLUGIN.accountants[:-1])  # lists "toy", which is not registered
    with pytest.raises(InvalidParameterError, match="mechanism 'toy' lists accountant 'toy', which is not registered"):
        register_plugin(broken)
    assert (list(MECHANISMS), list(ACCOUNTANTS), dict(EVENT_TYPES), rdp_routes(toy.ToyEvent)) == before
    with pytest.raises(InvalidParameterError, match="plugin 'gaussian' is already registered"):
        register_plugin(replace(toy.PLUGIN, mechanism=MECHANISMS["gaussian"]))
