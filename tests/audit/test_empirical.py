"""Empirical audits of the real sampler, clipping and training code."""

import json

import pytest

# the sampler and training audits run torch and Opacus (training-only libraries): without them
# this module is skipped, and the rest of tests/audit runs
pytest.importorskip("torch")
pytest.importorskip("opacus")

from dpnoise.audit.sampler import audit_sampler
from dpnoise.audit.training import audit_dirichlet_leakage, audit_one_run
from dpnoise.cli.main import main
from dpnoise.mechanisms import gaussian_noise, laplace_noise


@pytest.mark.parametrize("mechanism,noise", [("lap2", 1.0), ("laplace-l1", 0.5), ("gaussian", 1.0)])
@pytest.mark.parametrize("dim", [1, 8])
def test_sampler_audit_is_consistent(mechanism, noise, dim):
    r = audit_sampler(mechanism, noise, dim=dim, trials=40_000)
    assert r["consistent"], r
    assert r["confidence"] == 0.95


def test_sampler_audit_is_tight_for_laplace():
    r = audit_sampler("laplace-l1", 1.0, dim=1, trials=40_000)
    assert 0.9 < r["lower_bound_epsilon"] <= r["claimed_epsilon"]


@pytest.mark.parametrize("mechanism,bug", [
    ("lap2", lambda ref, noise, clip, gen: laplace_noise(ref, noise / 2, clip, gen)),
    ("gaussian", lambda ref, noise, clip, gen: gaussian_noise(ref, noise / 4, clip, gen)),
])
def test_sampler_audit_catches_too_little_noise(mechanism, bug):
    r = audit_sampler(mechanism, 1.0, dim=1, trials=40_000, sample_noise=bug)
    assert not r["consistent"]


@pytest.mark.parametrize("mechanism", ["gaussian", "lap2"])
def test_one_run_training_audit_is_consistent(mechanism):
    r = audit_one_run(mechanism, 1.0, sample_rate=0.2, steps=10, canaries=400, guesses=100)
    assert r["steps"] == 10
    assert r["consistent"], r
    assert r["lower_bound_epsilon"] > 0.3  # the canaries are detected: the audit has power


def test_dirichlet_update_leaks_beyond_the_output_epsilon():
    """docs/theory/dirichlet.md §5: the accountant's epsilon does not cover the parameters."""
    r = audit_dirichlet_leakage(r=0.1, trials=150)
    assert r["test"]["fpr"] == 0.0 and r["test"]["fnr"] == 0.0
    assert not r["consistent"] and r["lower_bound_epsilon"] > r["claimed_epsilon"]
    assert "NOT a guarantee" in r["scope"]


def test_cli_sampler_json(capsys):
    assert main(["audit", "sampler", "--mechanism", "lap2", "--noise", "1", "--trials", "20000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["consistent"] is True and {"claimed_epsilon", "lower_bound_epsilon", "confidence"} <= out.keys()


def test_a_users_many_examples_as_one_canary_stay_within_the_per_unit_epsilon():
    """Privacy units: each canary is a user of 5 examples.  Clipped per unit, the audit is consistent with the
    claimed epsilon; clipped per example (the control), the user's 5 clipped gradients break the claim."""
    options = dict(sample_rate=0.2, steps=10, canaries=1000, guesses=200, canary_examples=5)
    per_unit = audit_one_run("gaussian", 2.0, **options)
    per_example = audit_one_run("gaussian", 2.0, unit_clipping=False, **options)
    assert per_unit["claimed_epsilon"] == per_example["claimed_epsilon"]
    assert per_unit["consistent"], per_unit
    assert not per_example["consistent"] and per_example["lower_bound_epsilon"] > per_example["claimed_epsilon"]
