"""The checkpoint rules of an engine state, on plain dictionaries: no model, optimizer or engine."""

from dataclasses import asdict, replace

import pytest
import torch

from dpnoise.accounting import accountant_holding
from dpnoise.training.engine_state import ResumingRun, check_engine_state, with_discrete_steps
from dpnoise.training.errors import CheckpointMismatchError
from dpnoise.training.privacy_plan import PrivacyOptions, resolve

STEPS = 3


def resuming_run(secure_mode=False, **options) -> ResumingRun:
    plan = resolve(PrivacyOptions(**{"mechanism": "gaussian", "noise": 1.0, "delta": 1e-5, "max_grad_norm": 1.0,
                                     "secure_mode": secure_mode, **options}), sample_rate=0.01, params=100)
    return ResumingRun(plan.setup, 0, "secret", plan.max_steps, plan.setup.accountants, (), plan.step_event, 1, None,
                    torch.device("cpu"))


def saved_state(run: ResumingRun, steps=STEPS, event=None) -> dict:
    ledgers = {name: accountant_holding(name, ()).compose(event or run.step_event, steps).state_dict()
               for name in run.accountants}
    return {"run_id": "run-1", "setup": asdict(run.setup), "seed": run.seed, "private_randomness": "secret",
            "steps": steps, "budget_exhausted": False, "accountants": ledgers,
            "generators": {"device": "cpu", "ranks": [{}]}}


def test_a_consistent_state_passes():
    run = resuming_run()
    check_engine_state(saved_state(run), run)


@pytest.mark.parametrize("edit, message", [
    (lambda s: {**s, "steps": STEPS - 1}, "ledger records 3 steps, but the step counter says 2"),
    (lambda s: {**s, "steps": -1}, "steps: -1 is not a step count"),
    (lambda s: {**s, "seed": 5}, "differs from this run in seed"),
    (lambda s: {**s, "run_id": ""}, "run_id"),
    (lambda s: {**s, "setup": {**s["setup"], "noise": 2.0}}, "differs from this run in noise"),
    (lambda s: {**s, "budget_exhausted": True}, "budget_exhausted: set after 3 steps with no budget"),
    (lambda s: {**s, "generators": {"device": "cpu", "ranks": [{}, {}]}}, "number of processes"),
    (lambda s: {key: value for key, value in s.items() if key != "accountants"}, "engine state: no accountants"),
])
def test_each_rule_refuses_its_edit(edit, message):
    run = resuming_run()
    with pytest.raises(CheckpointMismatchError, match=message):
        check_engine_state(edit(saved_state(run)), run)


def test_a_ledger_recorded_with_another_noise_is_refused():
    run, other = resuming_run(), resuming_run(noise=2.0)
    with pytest.raises(CheckpointMismatchError, match="its ledger is not 3 steps of this run's privacy setup"):
        check_engine_state(saved_state(run, event=other.step_event), run)


def test_steps_beyond_the_budget_are_refused():
    run = resuming_run(noise=None, target_epsilon=1.0, epochs=1)
    with pytest.raises(CheckpointMismatchError, match=f"allows at most {run.max_steps}"):
        check_engine_state(saved_state(run, steps=run.max_steps + 1), run)


def test_a_secure_state_with_continuous_steps_is_rewritten_and_passes():
    run = resuming_run(secure_mode=True)
    old = saved_state(run, event=run.step_event.event)
    with pytest.raises(CheckpointMismatchError):
        check_engine_state({**old, "steps": STEPS - 1}, run)
    upgraded = with_discrete_steps(old, run)
    assert upgraded["accountants"] == saved_state(run)["accountants"]
    check_engine_state(old, run)
    assert with_discrete_steps(old, replace(run, step_event=run.step_event.event)) is old
