"""register_accountant: what it refuses, where it lists a new accountant; the registries' cross-checks."""

from dataclasses import replace

import pytest

from dpnoise.accounting import ACCOUNTANTS, MECHANISMS, AccountantSpec, InvalidParameterError, register_accountant
from dpnoise.accounting.registry import check_reported_accountants

RDP = AccountantSpec("gaussian-rdp-copy", "gaussian", True, "Sampled Gaussian RDP, again.")
MINIMUM = replace(RDP, name="gaussian-min", kind="minimum", routes=("gaussian-rdp",))
WARNING = "not a bound"


@pytest.mark.parametrize("spec, match", [
    (ACCOUNTANTS["gaussian-rdp"], "'gaussian-rdp' is already registered"),
    (replace(RDP, mechanism="cauchy"), "'gaussian-rdp-copy' accounts for mechanism 'cauchy', which is not registered"),
    (replace(RDP, kind="moments"), "'gaussian-rdp-copy' has kind 'moments'; choose from rdp, pld, minimum"),
    (replace(RDP, sound=False), "'gaussian-rdp-copy' is not sound and needs a warning"),
    (replace(RDP, warning=WARNING), "'gaussian-rdp-copy' is sound and takes no warning"),
    (replace(RDP, routes=("gaussian-pld",)), "'gaussian-rdp-copy' is of kind 'rdp', which takes no routes"),
    (replace(RDP, rdp_route="paper"),
     "'gaussian-rdp-copy' names RDP route 'paper', which GaussianEvent does not have \\(it has add-remove, replace-one\\)"),
    (replace(RDP, kind="pld", rdp_route="add-remove"), "'gaussian-rdp-copy' is of kind 'pld', which takes no RDP route"),
    (replace(MINIMUM, routes=()), "'gaussian-min' is a minimum of routes and needs at least one"),
    (replace(MINIMUM, sound=False, warning=WARNING), "'gaussian-min' is a minimum of sound routes and must be declared sound"),
    (replace(MINIMUM, routes=("gaussian-rdp", "gaussian-gdp")),
     "'gaussian-min' has route 'gaussian-gdp', which is not registered \\(register the routes before their minimum\\)"),
    (replace(MINIMUM, routes=("gaussian-rdp", "lap2-rdp")), "'gaussian-min' has route 'lap2-rdp' of mechanism 'lap2'"),
    (replace(MINIMUM, mechanism="lap2", routes=("lap2-rdp", "lap2-paper")),
     "'gaussian-min' has route 'lap2-paper', which is not sound"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_spec_that_does_not_fit_is_refused_naming_the_accountant(spec, match):
    before = list(ACCOUNTANTS.items())
    with pytest.raises(InvalidParameterError, match=f"^accountant {match}") as caught:
        register_accountant(spec)
    assert "\n" not in str(caught.value)
    assert list(ACCOUNTANTS.items()) == before


def test_an_accountant_is_listed_last_and_a_minimum_before_its_first_route():
    before = list(ACCOUNTANTS)
    try:
        assert register_accountant(RDP) is RDP
        assert register_accountant(replace(MINIMUM, routes=("gaussian-rdp-copy", "gaussian-pld"))).name == "gaussian-min"
        at = before.index("gaussian-pld")
        assert list(ACCOUNTANTS) == [*before[:at], "gaussian-min", *before[at:], "gaussian-rdp-copy"]
    finally:
        for name in ("gaussian-min", "gaussian-rdp-copy"):
            ACCOUNTANTS.pop(name, None)
    assert list(ACCOUNTANTS) == before


@pytest.mark.parametrize("mechanism, accountants, match", [
    ("gaussian", ("gaussian", "lap2-rdp"), "mechanism 'gaussian' lists accountant 'lap2-rdp' of another mechanism"),
    ("gaussian", ("gaussian", "cauchy"), "mechanism 'gaussian' lists accountant 'cauchy', which is not registered"),
    ("lap2", ("lap2-paper", "lap2"), "mechanism 'lap2': its default accountant must be sound"),
])
def test_the_registries_agree_on_each_mechanism_s_accountants(monkeypatch, mechanism, accountants, match):
    check_reported_accountants(mechanism)
    monkeypatch.setitem(MECHANISMS, mechanism, replace(MECHANISMS[mechanism], accountants=accountants))
    with pytest.raises(InvalidParameterError, match=match):
        check_reported_accountants(mechanism)


def test_each_event_type_s_default_rdp_route_is_the_sound_one():
    from dpnoise.accounting.events import DirichletEvent, GaussianEvent, Lap2Event, LaplaceEvent
    from dpnoise.accounting.rdp.registry import rdp_routes

    # the Gaussian event's default is add/remove (a release composed before training), not the
    # penultimate-layer baseline's replace-one route registered after it
    assert [rdp_routes(t)[0] for t in (GaussianEvent, LaplaceEvent, Lap2Event, DirichletEvent)] == [
        "add-remove", "add-remove", "sound", "replace-one"]


def test_an_accountant_s_rdp_route_applies_to_its_own_event_type_only():
    import numpy as np

    from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
    from dpnoise.accounting.rdp.registry import event_rdp

    orders = np.array([2.0, 8.0, 32.0])
    step = PoissonSampledEvent(0.1, GaussianEvent(1.0))
    replace_one = ACCOUNTANTS["penultimate-gaussian-replace-one-rdp"].rdp_route_key
    lap2_paper = ACCOUNTANTS["lap2-paper"].rdp_route_key
    assert (event_rdp(step, orders, replace_one) > event_rdp(step, orders)).all()  # its own bound
    assert (event_rdp(step, orders, lap2_paper) == event_rdp(step, orders)).all()  # another type's: the default
    with pytest.raises(NotImplementedError, match="RDP route 'tight' of GaussianEvent is not registered"):
        event_rdp(step, orders, (GaussianEvent, "tight"))


@pytest.mark.parametrize("spec, message", [
    (AccountantSpec(name="lap2-mine", mechanism="lap2", sound=True, description="x", kind="rdp", rdp_route="paper"),
     "declared sound over RDP route 'paper', which its mechanism's plugin declares not sound"),
    (AccountantSpec(name="dirichlet-mine", mechanism="dirichlet", sound=True, description="x", kind="release-count",
                    rdp_route="add-remove"),
     "declared sound over RDP route 'add-remove'"),
    (AccountantSpec(name=None, mechanism="lap2", sound=True, description="x"), "needs a name"),
    (AccountantSpec(name=5, mechanism="lap2", sound=True, description="x"), "needs a name"),
    (AccountantSpec(name="", mechanism="lap2", sound=True, description="x"), "needs a name"),
    (AccountantSpec(name="my acc", mechanism="lap2", sound=True, description="x"), "needs a name"),
    (AccountantSpec(name="lap2-mine", mechanism="lap2", sound=1, description="x"), "needs sound=True or False"),
])
def test_an_unsound_route_cannot_be_declared_sound_and_every_field_is_checked(spec, message):
    # Accepted, "lap2-mine" reported 6.0490 as make_private's primary where the exact lower
    # bound of the lap2-paper route's mechanism is 13.198.
    before = dict(ACCOUNTANTS)
    with pytest.raises(InvalidParameterError, match=message):
        register_accountant(spec)
    assert ACCOUNTANTS == before


def test_register_accountant_refuses_what_is_not_a_spec():
    with pytest.raises(InvalidParameterError, match="takes an AccountantSpec, got a dict"):
        register_accountant({"name": "x"})
