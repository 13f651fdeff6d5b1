"""resolve: a run's privacy (noise, step event, planned steps, budget) from its options, without torch."""

import dataclasses
import subprocess
import sys

import pytest

from dpnoise.accounting import InvalidParameterError, epsilon_of_events, step_event_from_keywords
from dpnoise.training.errors import InvalidTrainingOptionError, PrivacyBudgetExceededError
from dpnoise.training.privacy_plan import PrivacyOptions, resolve

Q, N = 256 / 60000, 26010


def test_a_given_noise_is_the_step_event_and_there_is_no_budget():
    plan = resolve(PrivacyOptions(mechanism="lap2", delta=1e-5, noise=0.8, max_grad_norm=0.5), sample_rate=Q, params=N)
    assert plan.step_event == step_event_from_keywords("lap2", sample_rate=Q, laplace_scale=0.8, clip=0.5, params=N)
    assert plan.setup.accountant == "lap2" and plan.setup.accountants[0] == "lap2"
    assert plan.calibration is None and plan.max_steps is None and plan.planned_steps is None


@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "dirichlet"])
def test_a_target_is_met_by_the_calibrated_noise_and_bounds_the_budget(mechanism):
    options = PrivacyOptions(mechanism=mechanism, delta=1e-5, target_epsilon=2.0, epochs=1.0)
    plan = resolve(options, sample_rate=Q, params=N)
    assert plan.planned_steps == 235 and plan.calibration.noise == plan.setup.noise

    def epsilon(steps):
        return epsilon_of_events(plan.setup.accountant, plan.step_event, steps=steps, delta=1e-5)

    assert epsilon(plan.planned_steps) <= 2.0
    assert plan.max_steps >= plan.planned_steps and epsilon(plan.max_steps) <= 2.0 < epsilon(plan.max_steps + 1)


def test_options_are_frozen_and_checked_by_name():
    options = PrivacyOptions(mechanism="dirichlet", delta=1e-5, noise=0.5)
    assert options.options.alpha == 1.0 and options.primary == "dirichlet"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.delta = 0.1
    for bad, name in [(dict(delta=1.0), "delta"), (dict(max_grad_norm=-1.0), "max_grad_norm"),
                      (dict(options={"alpha": 2.0}), "alpha does not apply to mechanism .gaussian."),
                      (dict(noise=None), "give noise_multiplier .fixed noise."),
                      (dict(accountant="dirichlet"), "accountant 'dirichlet' does not apply to mechanism gaussian"),
                      (dict(on_budget_exhausted="ignore"), "on_budget_exhausted"),
                      (dict(calibrate_with="gaussian-rdp", target_epsilon=1.0, epochs=1.0),
                       "calibrate_with applies only when the noise is calibrated: .* without noise_multiplier")]:
        with pytest.raises(InvalidParameterError, match=name):
            PrivacyOptions(**{"mechanism": "gaussian", "delta": 1e-5, "noise": 1.0, **bad})


def test_a_target_below_one_step_is_refused():
    with pytest.raises(PrivacyBudgetExceededError, match="below what even one step costs"):
        resolve(PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=0.5, target_epsilon=1e-3), sample_rate=Q,
                params=N)
    with pytest.raises(InvalidTrainingOptionError, match="epochs"):
        resolve(PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, epochs=1e308), sample_rate=Q, params=N)


def test_resolving_imports_no_torch():
    code = ("import sys; from dpnoise.training.privacy_plan import PrivacyOptions, resolve; "
            "resolve(PrivacyOptions(mechanism='gaussian', delta=1e-5, noise=1.0), sample_rate=0.01, params=10); "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
