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
