"""Accountant kinds as a registry: a new kind is added by one registration and used by get_accountant,
the quick epsilon and calibration; no module branches on a kind's name."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dpnoise.accounting import (
    ACCOUNTANT_KINDS,
    ACCOUNTANTS,
    AccountantKind,
    AccountantSpec,
    InvalidParameterError,
    RdpAccountant,
    calibrate,
    get_accountant,
    register_accountant,
    register_accountant_kind,
)
from dpnoise.accounting.kinds import NoiseRatioSearch
from dpnoise.accounting.solvers import solve_directly

SOURCE = Path(__file__).resolve().parents[2] / "src" / "dpnoise"
#: the Renyi orders of the toy kind: fewer than the default grid, so a sound but looser epsilon
COARSE_ORDERS = np.array([2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
STEP = dict(noise_multiplier=1.1, sample_rate=0.01, steps=1000)
DELTA = 1e-5


class CoarseRdpAccountant(RdpAccountant):
    """The toy kind's accountant: an RDP accountant over :data:`COARSE_ORDERS` only."""

    def __init__(self, name: str) -> None:
        super().__init__(name, COARSE_ORDERS)


#: accountants the toy kind's solve strategy was asked about, in order
SOLVED: list[str] = []


def solve_and_record(search: NoiseRatioSearch, accountant: str, initial: float, slope: float) -> float:
    SOLVED.append(accountant)
    return solve_directly(search, accountant, initial, slope)


COARSE_KIND = AccountantKind("coarse-rdp", CoarseRdpAccountant, solve_and_record, cheap_epsilon=True,
                             takes_rdp_route=True)


@pytest.fixture
def coarse_kind():
    """The toy kind registered (one call), with a Gaussian accountant of it and a minimum over it and the
    Gaussian PLD; every registry as it was afterwards."""
    kinds, accountants = dict(ACCOUNTANT_KINDS), dict(ACCOUNTANTS)
    register_accountant_kind(COARSE_KIND)
    register_accountant(AccountantSpec("gaussian-coarse-rdp", "gaussian", True, "Sampled Gaussian RDP, 6 orders.",
                                       kind="coarse-rdp"))
    register_accountant(AccountantSpec("gaussian-coarse", "gaussian", True, "min(gaussian-coarse-rdp, gaussian-pld)",
                                       kind="minimum", routes=("gaussian-coarse-rdp", "gaussian-pld")))
    SOLVED.clear()
    try:
        yield COARSE_KIND
    finally:
        for registry, before in ((ACCOUNTANT_KINDS, kinds), (ACCOUNTANTS, accountants)):
            registry.clear()
            registry.update(before)


def test_a_registered_kind_is_built_by_get_accountant_and_accounted_by_its_class(coarse_kind):
    acc = get_accountant("gaussian-coarse-rdp").step(**STEP)
    assert type(acc) is CoarseRdpAccountant and acc.spec.accountant_kind is coarse_kind
    reference = get_accountant("gaussian-rdp", orders=COARSE_ORDERS).step(**STEP)
    assert acc.get_epsilon(DELTA) == reference.get_epsilon(DELTA)
    assert acc.get_epsilon(DELTA) >= get_accountant("gaussian-rdp").step(**STEP).get_epsilon(DELTA)
    with pytest.raises(InvalidParameterError, match="orders= applies to RDP accountants only"):
        get_accountant("gaussian-coarse-rdp", orders=COARSE_ORDERS)  # the kind does not take orders
    with pytest.raises(InvalidParameterError, match="is of kind 'coarse-rdp', accounted by CoarseRdpAccountant"):
        RdpAccountant("gaussian-coarse-rdp")


def test_a_minimum_s_quick_epsilon_takes_the_routes_whose_kind_is_cheap(coarse_kind):
    acc = get_accountant("gaussian-coarse").step(**STEP)
    assert acc.get_quick_epsilon(DELTA) == get_accountant("gaussian-coarse-rdp").step(**STEP).get_epsilon(DELTA)
    assert acc.get_quick_epsilon(DELTA) >= acc.get_epsilon(DELTA)


def test_calibration_solves_by_the_kind_s_strategy(coarse_kind):
    result = calibrate("gaussian-coarse-rdp", 2.0, DELTA, 0.01, 1000)
    assert SOLVED == ["gaussian-coarse-rdp"]
    assert result.epsilon <= 2.0 and result.epsilon == pytest.approx(2.0, rel=1e-6)
    assert result.noise >= calibrate("gaussian-rdp", 2.0, DELTA, 0.01, 1000).noise


def test_a_kind_that_takes_no_rdp_route_or_routes_is_refused_them(coarse_kind):
    plain = AccountantKind("plain", CoarseRdpAccountant, solve_directly)
    register_accountant_kind(plain)
    for spec, match in (
        (AccountantSpec("g-plain", "gaussian", True, "x", kind="plain", rdp_route="add-remove"), "takes no RDP route"),
        (AccountantSpec("g-plain", "gaussian", True, "x", kind="plain", routes=("gaussian-rdp",)), "takes no routes"),
        (AccountantSpec("g-plain", "gaussian", True, "x", kind="cauchy"),
         "has kind 'cauchy'; choose from rdp, pld, minimum, release-count, coarse-rdp, plain"),
    ):
        with pytest.raises(InvalidParameterError, match=match):
            register_accountant(spec)


@pytest.mark.parametrize("kind, match", [
    (AccountantKind("rdp", RdpAccountant, solve_directly), "accountant kind 'rdp' is already registered"),
    (AccountantKind("my kind", RdpAccountant, solve_directly), "needs a name"),
    (AccountantKind("mine", "RdpAccountant", solve_directly), "needs an accountant class, got str"),
    (AccountantKind("mine", RdpAccountant, None), "needs a callable solve strategy"),
    ({"name": "mine"}, "takes an AccountantKind, got a dict"),
])
def test_register_accountant_kind_refuses_what_does_not_fit(kind, match):
    before = dict(ACCOUNTANT_KINDS)
    with pytest.raises(InvalidParameterError, match=match):
        register_accountant_kind(kind)
    assert ACCOUNTANT_KINDS == before


#: where a kind's quoted name may stand: a spec naming its kind, or the kind's own registration
_DECLARATION = re.compile(r"(\bkind\s*(:\s*str\s*)?=|AccountantKind\()\s*$")


def kind_literals_outside_declarations(text: str, kinds: list[str]) -> list[str]:
    """The lines of ``text`` where a quoted kind name stands anywhere but in a declaration (a comparison,
    a dictionary key, a membership test: a branch on the kind's name)."""
    quoted = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, kinds)))
    return list(dict.fromkeys(line.strip() for line in text.splitlines() for hit in quoted.finditer(line)
                              if not _DECLARATION.search(line[:hit.start()])))


def test_the_checker_finds_a_branch_on_a_kind_s_name():
    kinds = ["rdp", "pld", "minimum"]
    branches = ['if spec.kind == "rdp":', "sorted(routes, key=lambda r: 'pld' != kind)",
                'if spec.kind in ("rdp", "minimum"):', '_KINDS = {"rdp": RdpAccountant}']
    declarations = ['AccountantSpec("g", "gaussian", True, "x", kind="pld")', 'kind: str = "rdp"',
                    'register_accountant_kind(AccountantKind("minimum", MinimumAccountant, solve_over_routes))']
    assert kind_literals_outside_declarations("\n".join(branches + declarations), kinds) == branches


def test_no_module_branches_on_a_kind_s_name():
    """Every place that depends on the kind asks its :class:`AccountantKind`; only the kind registry's own
    module (its docstring) names kinds otherwise."""
    kinds = list(ACCOUNTANT_KINDS)
    found = {str(path.relative_to(SOURCE)): lines for path in sorted(SOURCE.rglob("*.py"))
             if path.name != "kinds.py" or path.parent.name != "accounting"
             for lines in [kind_literals_outside_declarations(path.read_text(), kinds)] if lines}
    assert found == {}
