"""Poisson batches, one accountant step per optimizer step, budget enforcement, scope statements."""

import math
import warnings

import numpy as np
import pytest
import torch

from dpnoise.accounting import ACCOUNTANTS, UnsoundAccountantWarning, noise_keywords
from dpnoise.mechanisms import RUNNABLE_MECHANISMS
from dpnoise.training import PrivacyBudgetExceededError, endless_batches, make_private, train_steps

from training_helpers import digits_loader, mlp

NOISE = {"gaussian": 1.0, "lap2": 1.0, "laplace-l1": 1.0, "dirichlet": 0.05, "penultimate-gaussian": 2.0}


def private(dataset, mechanism, **options):
    model = mlp(hidden=16)
    noise = options.pop("noise", NOISE[mechanism])
    options = {**noise_keywords(mechanism, noise), "delta": 1e-5, "seed": 0, **options}
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.05), digits_loader(dataset, 64),
                        mechanism=mechanism, **options)


def test_poisson_batch_sizes_match_binomial_statistics(digits_train):
    _, optimizer, loader = private(digits_train, "lap2")
    n, q = len(digits_train), optimizer.privacy_engine.setup.sample_rate
    assert q == pytest.approx(64 / n) and loader.sample_rate == q
    sizes = np.array([len(y) for _, y in (batch for _, batch in zip(range(400), endless_batches(loader)))])
    mean, variance = n * q, n * q * (1 - q)  # Poisson(qN) for small q; Binomial(N, q) exactly
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(variance / len(sizes))
    assert 0.75 < sizes.var(ddof=1) / variance < 1.3
    assert len(set(sizes.tolist())) > 10  # batch sizes really vary


@pytest.mark.parametrize("mechanism", sorted(RUNNABLE_MECHANISMS))
def test_accountants_step_once_per_optimizer_step(digits_train, mechanism):
    module, optimizer, loader = private(digits_train, mechanism)
    engine = optimizer.privacy_engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        history = train_steps(module, optimizer, endless_batches(loader), engine, 7)
        epsilons = engine.epsilon_by_accountant()
    assert len(history) == engine.steps == 7
    assert [h.step for h in history] == list(range(1, 8))
    assert all(acc.steps == 7 for acc in engine.accountants.values())
    assert set(epsilons) >= {mechanism}
    assert all(e > 0 for e in epsilons.values())
    if mechanism == "lap2":
        assert set(epsilons) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    assert engine.scope_statement == ACCOUNTANTS[engine.setup.accountant].scope
    assert (engine.scope_statement is not None) == (mechanism in ("dirichlet", "penultimate-gaussian"))


def test_budget_enforcement_raises_at_the_target(digits_train):
    module, optimizer, loader = private(digits_train, "gaussian", target_epsilon=4.0)
    engine = optimizer.privacy_engine
    assert engine.max_steps is not None and 0 < engine.max_steps < 1000
    with pytest.raises(PrivacyBudgetExceededError, match="exceed the privacy budget"):
        train_steps(module, optimizer, endless_batches(loader), engine, engine.max_steps + 5)
    assert engine.steps == engine.max_steps and engine.budget_exhausted
    assert engine.get_epsilon() <= 4.0
    engine.accountant.compose(engine.step_event)
    assert engine.get_epsilon() > 4.0  # one more step would have been too many


def test_budget_enforcement_can_stop_cleanly(digits_train):
    module, optimizer, loader = private(digits_train, "dirichlet", target_epsilon=3.0, on_budget_exhausted="stop")
    engine = optimizer.privacy_engine
    history = train_steps(module, optimizer, endless_batches(loader), engine, engine.max_steps + 5)
    assert len(history) == engine.steps == engine.max_steps and engine.budget_exhausted
    before = [p.detach().clone() for p in module.parameters()]
    train_steps(module, optimizer, endless_batches(loader), engine, 3)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
    assert engine.steps == engine.max_steps


def test_calibrated_noise_spends_the_budget_in_the_planned_steps(digits_train):
    _, optimizer, _ = private(digits_train, "lap2", noise=None, target_epsilon=2.0, epochs=3)
    engine = optimizer.privacy_engine
    assert engine.planned_steps == math.ceil(3 / engine.setup.sample_rate - 1e-9)
    assert engine.max_steps >= engine.planned_steps
    assert engine.calibration.epsilon == pytest.approx(2.0, rel=1e-6)
    assert engine.calibration.noise == engine.setup.noise


def test_paper_accountant_as_primary_is_warned(digits_train):
    with pytest.warns(UnsoundAccountantWarning, match="NOT a valid privacy bound"):
        private(digits_train, "lap2", accountant="lap2-paper")
