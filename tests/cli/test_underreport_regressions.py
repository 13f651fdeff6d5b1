"""The reported under-estimates, at their exact commands: each now gives a correct epsilon or exit 2."""

import json
import math

import pytest

from dpnoise.accounting import get_accountant
from dpnoise.cli.main import main

pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_laplace_l1_one_step_is_the_laplace_mechanism(capsys):
    """Was epsilon 11.33 for C/b = 20 (the audit's exact lower bound: 19.99998)."""
    out = run_json(capsys, ["account", "--mechanism", "laplace-l1", "--noise", "0.05", "--sample-rate", "1",
                            "--steps", "1", "--delta", "1e-5"])
    exact = 20 + 2 * math.log1p(-1e-5)  # eps(delta) of the Laplace mechanism with shift C/b = 20
    assert out["epsilon"] >= exact - 1e-9
    assert out["epsilon_by_accountant"]["laplace-l1-rdp"] >= exact


@pytest.mark.parametrize("noise", [0.05, 1e-3, 1e-8, 1e-300])
def test_laplace_l1_epsilon_grows_as_the_noise_vanishes(noise):
    """Was stuck at 11.33 for every b from 0.05 down to 1e-300."""
    eps = get_accountant("laplace-l1").step(laplace_scale=noise, sample_rate=1.0).get_epsilon(1e-5)
    exact = 1.0 / noise + 2 * math.log1p(-1e-5)
    assert eps >= exact * (1 - 1e-12) - 1e-9  # double precision: relative rounding at 1e300


def test_laplace_l1_calibration_adds_real_noise(capsys):
    """Was b = 1e-8 'reaching' epsilon 12."""
    out = run_json(capsys, ["calibrate", "--mechanism", "laplace-l1", "--epsilon", "12", "--sample-rate", "0.0043",
                            "--steps", "5860", "--delta", "1e-5"])
    assert out["noise"] > 0.2 and out["epsilon"] <= 12
    # dp_accounting's own (optimistic) PLD at that noise is within the target too.
    reference = pld.from_laplace_mechanism(out["noise"], pessimistic_estimate=False, sampling_prob=0.0043)
    assert reference.self_compose(5860).get_epsilon_for_delta(1e-5) <= 12


@pytest.mark.parametrize("mechanism", ["gaussian", "penultimate-gaussian"])
@pytest.mark.parametrize("noise", ["1e-300", "1e-200", "1e-155"])
def test_gaussian_at_tiny_sigma_is_not_private(capsys, mechanism, noise):
    """Was epsilon 0.8254 (after a NaN) for every sigma below ~1e-155."""
    out = run_json(capsys, ["account", "--mechanism", mechanism, "--noise", noise, "--sample-rate", "0.01",
                            "--steps", "100", "--delta", "1e-5"])
    assert (out["epsilon"] is None and out["epsilon_reason"].startswith("inf")) or out["epsilon"] > 1e100


def test_gaussian_at_huge_sigma_gives_a_number_not_a_traceback(capsys):
    out = run_json(capsys, ["account", "--mechanism", "gaussian", "--noise", "1e308", "--sample-rate", "0.01",
                            "--steps", "100", "--delta", "1e-5"])
    assert 0 <= out["epsilon"] < 0.1


@pytest.mark.parametrize("mechanism", ["gaussian", "penultimate-gaussian"])
def test_training_without_noise_is_refused(capsys, mechanism):
    """`train --noise 1e-200 --epsilon 3` trained without noise and passed the budget check."""
    code = main(["train", "--dataset", "digits", "--mechanism", mechanism, "--noise", "1e-200", "--epsilon", "3",
                 "--delta", "1e-5", "--epochs", "1", "--batch-size", "64", "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "epsilon 3" in err and len(err.strip().splitlines()) == 1


def test_json_output_is_strict_json_with_a_reason_for_an_uncertified_epsilon(capsys):
    from dpnoise.cli.main import main

    assert main(["account", "--mechanism", "gaussian", "--noise", "1e-300", "--sample-rate", "0.01", "--steps",
                 "100", "--delta", "1e-5", "--json"]) == 0
    raw = capsys.readouterr().out

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    out = json.loads(raw, parse_constant=refuse)
    assert out["epsilon"] is None and out["epsilon_reason"].startswith("inf (not a finite number")


def test_a_dataset_size_beside_a_sample_rate_is_refused_not_ignored(capsys):
    from dpnoise.cli.main import main

    assert main(["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.01", "--steps", "10",
                 "--delta", "1e-5", "--dataset-size", "-5"]) == 2
    assert "--dataset-size goes with --batch-size" in capsys.readouterr().err
