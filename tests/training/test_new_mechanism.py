"""A new mechanism is one module and one registration (tests/toy_mechanism.py): the command line, the
calibrators, the audit and the training engine pick it up with nothing else to change.

The toy is the Gaussian mechanism under its own name and event type, so each layer must give it
exactly the Gaussian's numbers."""

import json
import warnings

import pytest
import torch

import toy_mechanism as toy
from dpnoise.accounting import MECHANISMS, calibrate
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
    account = {m: cli_json(capsys, "account", "--mechanism", m, "--noise", "1.3", *SETTING) for m in ("toy", "gaussian")}
    assert account["toy"]["epsilon_by_accountant"] == {
        "toy": account["gaussian"]["epsilon"], "toy-pld": account["gaussian"]["epsilon_by_accountant"]["gaussian-pld"],
        "toy-rdp": account["gaussian"]["epsilon_by_accountant"]["gaussian-rdp"]}
    calibrated = {m: cli_json(capsys, "calibrate", "--mechanism", m, "--epsilon", "3", *SETTING) for m in ("toy", "gaussian")}
    assert calibrated["toy"]["noise_multiplier"] == calibrated["gaussian"]["noise_multiplier"]
    assert calibrated["toy"]["epsilon"] == calibrated["gaussian"]["epsilon"] <= 3


def test_the_calibrator_and_the_audit_pick_up_the_new_mechanism(toy_registered):
    result = calibrate("toy-rdp", 2.0, 1e-5, 0.05, 200)
    assert (result.mechanism, result.noise) == ("toy", calibrate("gaussian-rdp", 2.0, 1e-5, 0.05, 200).noise)
    bound = lower_bound("toy", 1.3, 0.05, 200, 1e-5, grid=1 << 16)
    assert bound.epsilon == lower_bound("gaussian", 1.3, 0.05, 200, 1e-5, grid=1 << 16).epsilon
    assert 0 < bound.epsilon <= calibrate("toy", 3.0, 1e-5, 0.05, 200).epsilon


def test_the_engine_trains_with_the_new_mechanism_as_with_the_gaussian(toy_registered, digits_train):
    runs = {}
    for mechanism in ("toy", "gaussian"):
        model = mlp(hidden=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the noise seed's warning
            model, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                    digits_loader(digits_train, 64), mechanism=mechanism,
                                                    noise_multiplier=1.3, delta=1e-5, seed=0, noise_seed=0)
        for step, (x, y) in zip(range(3), loader):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        engine = optimizer.privacy_engine
        runs[mechanism] = ([p.detach().clone() for p in model.parameters()], engine.epsilon_by_accountant())
    assert all(torch.equal(a, b) for a, b in zip(runs["toy"][0], runs["gaussian"][0]))  # the same noise law and draws
    toy_eps, gaussian_eps = runs["toy"][1], runs["gaussian"][1]
    assert toy_eps == {"toy": gaussian_eps["gaussian"], "toy-pld": gaussian_eps["gaussian-pld"],
                       "toy-rdp": gaussian_eps["gaussian-rdp"]}


def test_dpnoise_train_runs_the_new_mechanism_as_the_gaussian(toy_registered, capsys):
    common = ["train", "--dataset", "digits", "--model", "cnn", "--delta", "1e-5", "--batch-size", "64", "--epochs", "1",
              "--epsilon", "2", "--threads", "1", "--no-progress", "--seed", "0", "--noise-seed", "0", "--json"]
    reports = {m: cli_json(capsys, *common, "--mechanism", m) for m in ("toy", "gaussian")}
    toy_report, gaussian_report = reports["toy"], reports["gaussian"]
    assert toy_report["mechanism"] == "toy" and toy_report["accountant"] == "toy"
    assert (toy_report["noise"], toy_report["epsilon"], toy_report["test_accuracy"]) == (
        gaussian_report["noise"], gaussian_report["epsilon"], gaussian_report["test_accuracy"])
