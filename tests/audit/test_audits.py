"""Every sound accountant survives its audits; the published Lap2 accountant is caught (docs/theory/lap2.md §3)."""

import json
import re

import pytest

from dpnoise.accounting import ACCOUNTANTS, UnsoundAccountantWarning, calibrate_dirichlet_r
from dpnoise.audit import audit_bound, pld
from dpnoise.cli.main import main

FAST = {"grid": 1 << 15}
SOUND = [name for name, spec in ACCOUNTANTS.items() if spec.sound]
MNIST = {"sample_rate": 0.0043, "steps": 5860, "delta": 1e-5, "params": 26010}


@pytest.mark.parametrize("accountant", SOUND)
@pytest.mark.parametrize("noise,q,steps", [(0.5, 0.05, 20), (1.0, 0.02, 100), (2.0, 0.2, 30)])
def test_sound_accountants_are_consistent(accountant, noise, q, steps):
    kwargs = {"params": 200, "ks": [1, 10, 200]} if ACCOUNTANTS[accountant].mechanism == "lap2" else {}
    r = audit_bound(accountant, noise, q, steps, 1e-5, **kwargs, **FAST)
    assert r["consistent"], r
    if r["claimed_epsilon"] < float("inf"):  # Dirichlet r >= alpha admits no order: no claim
        assert r["lower_bound_epsilon"] > 0.3 * r["claimed_epsilon"]  # the audit is not vacuous


@pytest.mark.parametrize("b", [0.4, 0.6])
def test_lap2_paper_is_caught_in_the_mnist_setting(b):
    r = audit_bound("lap2-paper", b, **MNIST, ks=[10322], grid=1 << 17, loss_step=1e-5)
    assert not r["consistent"]
    if b == 0.4:  # docs/theory/lap2.md §3: paper 7.94, exact lower bound about 31.7
        assert r["claimed_epsilon"] == pytest.approx(7.94, abs=0.01)
        assert r["lower_bound_epsilon"] > 30.0  # 31.7 at full resolution (docs/AUDITS.md)


def test_lap2_paper_is_not_flagged_where_it_is_conservative():
    r = audit_bound("lap2-paper", 0.8, **MNIST, ks=[10322], grid=1 << 17, loss_step=1e-5)
    assert r["consistent"] and r["lower_bound_epsilon"] > 2.6


#: the theory notes' Dirichlet setting (docs/theory/dirichlet.md §3): q = 256/50000, 30 epochs, delta = 1e-5
DIRICHLET_SETTING = {"sample_rate": 256 / 50000, "steps": 5860, "delta": 1e-5}


@pytest.mark.filterwarnings("ignore::dpnoise.accounting.UnsoundAccountantWarning")
@pytest.mark.parametrize("reading,default,noise", [("dirichlet-add-remove", "dirichlet", 0.3333),
                                                   ("penultimate-gaussian-pld", "penultimate-gaussian", 2.0)])
def test_the_add_remove_reading_of_an_output_mechanism_is_caught_and_its_default_survives(reading, default, noise):
    """Replace-one adjacency, each sampled example's output released: the exact lower bound refutes Theorem 10's
    add/remove reading (for the Dirichlet r* it calibrates to epsilon 4: above 19), not the default."""
    caught = audit_bound(reading, noise, **DIRICHLET_SETTING, alpha=1.0 if default == "dirichlet" else None)
    assert not caught["consistent"] and caught["lower_bound_epsilon"] > 4 * caught["claimed_epsilon"], caught
    if default == "dirichlet":
        assert caught["claimed_epsilon"] < 4.0 < 19.0 < caught["lower_bound_epsilon"]
    held = audit_bound(default, noise, **DIRICHLET_SETTING, alpha=1.0 if default == "dirichlet" else None)
    assert held["consistent"] and held["claimed_epsilon"] >= caught["lower_bound_epsilon"]
    assert held["lower_bound_epsilon"] > 0.8 * held["claimed_epsilon"]  # close to exact


def test_the_ponnoprat_warning_states_a_lower_bound_at_its_own_calibration():
    """Its example: the r* that dirichlet-ponnoprat itself calibrates to epsilon 4, and a true epsilon that the
    exact lower bound at that r* reaches (not the add/remove reading's, at another r*)."""
    stated_epsilon, stated_r = map(float, re.search(r"at least ([\d.]+) at r = ([\d.]+)",
                                                    ACCOUNTANTS["dirichlet-ponnoprat"].warning).groups())
    setting = DIRICHLET_SETTING
    with pytest.warns(UnsoundAccountantWarning, match="at least"):
        r_star = calibrate_dirichlet_r(4.0, setting["delta"], setting["sample_rate"], setting["steps"], alpha=1.0,
                                       accountant="dirichlet-ponnoprat").noise
    assert stated_r == pytest.approx(r_star, abs=1e-4)
    bound = pld.lower_bound("dirichlet", r_star, setting["sample_rate"], setting["steps"], setting["delta"], alpha=1.0,
                            grid=1 << 18)
    assert stated_epsilon <= bound.epsilon < stated_epsilon + 0.1


def test_sound_lap2_survives_the_mnist_setting():
    r = audit_bound("lap2", 0.4, **MNIST, ks=[10322], grid=1 << 17, loss_step=1e-5)
    assert r["consistent"] and r["lower_bound_epsilon"] > 0.45 * r["claimed_epsilon"]


def test_cli_bound_reports_inconsistency(capsys):
    argv = ["audit", "bound", "--mechanism", "lap2-paper", "--noise", "0.4", "--clip", "1",
            "--sample-rate", "0.0043", "--steps", "5860", "--params", "26010", "--delta", "1e-5",
            "--k", "10322", "--grid", "131072", "--loss-step", "1e-5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["consistent"] is False
    assert out["lower_bound_epsilon"] > out["claimed_epsilon"]
    for key in ("claimed_epsilon", "lower_bound_epsilon", "consistent"):
        assert key in out


@pytest.mark.parametrize("sub", ["bound", "sampler", "training", "dirichlet-leakage"])
def test_cli_help(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["audit", sub, "--help"])
    assert exit_.value.code == 0
    assert "--json" in capsys.readouterr().out
