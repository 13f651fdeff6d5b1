"""A new mechanism is one module and one registration (tests/toy_mechanism.py): the command line, the
calibrators, the audit and the training engine pick it up, its noise unit and its side parameter
included, with nothing else to change.

The toy is the Gaussian mechanism with its noise as an absolute std s and a group size k (sensitivity
k C), so each layer must give it exactly the Gaussian's numbers at noise multiplier s / (k C)."""

import json
import warnings

import pytest
import torch

import toy_mechanism as toy
from dpnoise.accounting import MECHANISMS, calibrate, epsilon_after
from dpnoise.audit.bound import audit_bound
from dpnoise.audit.pld import lower_bound
from dpnoise.cli.main import main
from dpnoise.training import make_private
from training_helpers import digits_loader, mlp

SETTING = ["--sample-rate", "0.05", "--steps", "200", "--delta", "1e-5", "--json"]


@pytest.fixture
def toy_registered():
    before = list(MECHANISMS)
    with toy.registered():
        yield
    assert list(MECHANISMS) == before


def cli_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_command_line_accounts_and_calibrates_the_new_mechanism(toy_registered, capsys):
    """std 2.6 for groups of 2 at clip 1 is the Gaussian at sigma 1.3; the generated --group-size flag."""
    toy_run = cli_json(capsys, "account", "--mechanism", "toy", "--noise", "2.6", "--group-size", "2", *SETTING)
    gaussian = cli_json(capsys, "account", "--mechanism", "gaussian", "--noise", "1.3", *SETTING)
    assert toy_run["group_size"] == 2
    assert toy_run["epsilon_by_accountant"] == {
        "toy": gaussian["epsilon"], "toy-pld": gaussian["epsilon_by_accountant"]["gaussian-pld"],
        "toy-rdp": gaussian["epsilon_by_accountant"]["gaussian-rdp"]}
    calibrated = cli_json(capsys, "calibrate", "--mechanism", "toy", "--epsilon", "3", "--group-size", "2",
                          "--clip", "0.5", *SETTING)
    reference = cli_json(capsys, "calibrate", "--mechanism", "gaussian", "--epsilon", "3", *SETTING)
    assert calibrated["toy_std"] == pytest.approx(2 * 0.5 * reference["noise_multiplier"], rel=1e-3)
    assert calibrated["epsilon"] <= 3 and calibrated["group_size"] == 2
    assert main(["account", "--mechanism", "gaussian", "--noise", "1", "--group-size", "2", *SETTING]) == 2
    assert "--group-size does not apply to mechanism 'gaussian' (only to toy)" in capsys.readouterr().err


def test_the_calibrator_and_the_audit_pick_up_the_new_mechanism(toy_registered):
    result = calibrate("toy-rdp", 2.0, 1e-5, 0.05, 200, group_size=3)
    gaussian = calibrate("gaussian-rdp", 2.0, 1e-5, 0.05, 200)
    assert (result.mechanism, result.options) == ("toy", toy.ToyOptions(group_size=3))
    assert result.noise == pytest.approx(3 * gaussian.noise, rel=1e-4) and result.epsilon <= 2.0
    bound = lower_bound("toy", 2.6, 0.05, 200, 1e-5, grid=1 << 16, group_size=2)
    assert bound.epsilon == lower_bound("gaussian", 1.3, 0.05, 200, 1e-5, grid=1 << 16).epsilon
    audit = audit_bound("toy", 2.6, 0.05, 200, 1e-5, grid=1 << 16, group_size=2)
    assert audit["consistent"] and audit["group_size"] == 2 and audit["lower_bound_epsilon"] == bound.epsilon


def test_the_engine_trains_with_the_new_mechanism_as_with_the_gaussian(toy_registered, digits_train):
    """The same noise draws (std 2.6 = sigma 2.6 x C 1), the epsilon of sigma 2.6 / 2 for groups of 2."""
    runs = {}
    for mechanism, noise, options in (("toy", 2.6, {"options": toy.ToyOptions(group_size=2)}),
                                      ("gaussian", 2.6, {})):
        model = mlp(hidden=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the noise seed's warning
            model, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                    digits_loader(digits_train, 64), mechanism=mechanism,
                                                    noise=noise, delta=1e-5, seed=0, noise_seed=0, **options)
        for step, (x, y) in zip(range(3), loader):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        engine = optimizer.privacy_engine
        runs[mechanism] = ([p.detach().clone() for p in model.parameters()], engine)
    assert all(torch.equal(a, b) for a, b in zip(runs["toy"][0], runs["gaussian"][0]))  # the same noise law and draws
    toy_engine = runs["toy"][1]
    assert toy_engine.setup.options == {"group_size": 2}
    expected = epsilon_after("gaussian", steps=3, delta=1e-5, sample_rate=toy_engine.setup.sample_rate,
                             noise_multiplier=1.3)
    assert toy_engine.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-12)


def test_dpnoise_train_runs_the_new_mechanism_with_its_generated_flag(toy_registered, capsys):
    common = ["train", "--dataset", "digits", "--model", "cnn", "--delta", "1e-5", "--batch-size", "64", "--epochs", "1",
              "--epsilon", "2", "--threads", "1", "--no-progress", "--seed", "0", "--noise-seed", "0", "--json"]
    toy_report = cli_json(capsys, *common, "--mechanism", "toy", "--group-size", "2")
    gaussian_report = cli_json(capsys, *common, "--mechanism", "gaussian")
    assert toy_report["mechanism"] == "toy" and toy_report["accountant"] == "toy"
    assert toy_report["group_size"] == 2
    assert toy_report["noise"] == pytest.approx(2 * gaussian_report["noise"], rel=1e-3)
    assert toy_report["epsilon"] <= 2 and gaussian_report["epsilon"] <= 2
