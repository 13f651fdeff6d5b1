"""The step ledger: the optimizers' whole view of the engine (admit a step against the budget, record it)."""

import pytest

from dpnoise.accounting import get_accountant, step_event_from_keywords
from dpnoise.training.errors import PrivacyBudgetExceededError
from dpnoise.training.step_ledger import StepLedger

EVENT = step_event_from_keywords("gaussian", sample_rate=0.01, noise_multiplier=1.1)


def ledger(**options) -> StepLedger:
    return StepLedger(EVENT, {name: get_accountant(name) for name in ("gaussian-rdp", "gaussian-pld")}, **options)


def test_each_recorded_step_composes_the_step_event_into_every_accountant():
    steps = ledger()
    for _ in range(3):
        assert steps.admit_step()  # no budget: always admitted
        steps.record_step()
    assert steps.steps == 3 and not steps.budget_exhausted
    for name, accountant in steps.accountants.items():
        assert accountant.history == [(EVENT, 3)]
        assert accountant.get_epsilon(1e-5) == get_accountant(name).compose(EVENT, 3).get_epsilon(1e-5)


def test_a_step_past_the_budget_is_refused_or_skipped_by_the_policy():
    raising = ledger(max_steps=2, budget="epsilon=1.0 (delta=1e-05, accountant gaussian-rdp)")
    for _ in range(2):
        assert raising.admit_step()
        raising.record_step()
    with pytest.raises(PrivacyBudgetExceededError, match=r"^step 3 would exceed the privacy budget epsilon=1.0 "
                                                        r"\(delta=1e-05, accountant gaussian-rdp\): at most 2 steps$"):
        raising.admit_step()
    assert raising.budget_exhausted and raising.steps == 2
    stopping = ledger(max_steps=0, policy="stop")
    assert not stopping.admit_step() and stopping.budget_exhausted
    assert all(not accountant.history for accountant in stopping.accountants.values())


def test_the_engine_reads_its_plan_and_ledger_where_they_live(digits_train):
    import torch

    from dpnoise.training import PrivacyEngine, make_private
    from dpnoise.training.errors import EngineStateError
    from training_helpers import digits_loader, mlp

    engine = PrivacyEngine(seed=0)
    assert (engine.setup, engine.steps, engine.step_event, engine.budget_exhausted, engine.budget_policy) == \
        (None, 0, None, False, "raise")
    with pytest.raises(EngineStateError, match="before make_private"):
        engine.steps = 3
    model = mlp(hidden=8)
    _, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train),
                                   mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, seed=0)
    engine = optimizer.privacy_engine
    assert engine.setup is engine.plan.setup and engine.step_event is engine.ledger.step_event
    engine.steps = 2
    assert engine.ledger.steps == 2
    with pytest.raises(AttributeError, match="read-only"):
        engine.max_steps = 5
