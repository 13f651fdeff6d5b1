"""A run interrupted, checkpointed and resumed equals the uninterrupted run with the same seed."""

import warnings

import pytest
import torch

from dpnoise.accounting import UnsoundAccountantWarning
from dpnoise.training import (
    CheckpointMismatchError,
    endless_batches,
    load_checkpoint,
    make_private,
    save_checkpoint,
    train_steps,
)

from training_helpers import digits_loader, mlp

TOTAL_STEPS, INTERRUPT_AT = 10, 4


def build(dataset, mechanism, seed, noise):
    model = mlp(hidden=16, seed=seed)  # a different seed gives different initial weights
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return make_private(model, optimizer, digits_loader(dataset, 64), mechanism=mechanism, noise=noise,
                        max_grad_norm=1.0, delta=1e-5, seed=seed)


def run(module, optimizer, loader, steps):
    engine = optimizer.privacy_engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        train_steps(module, optimizer, endless_batches(loader), engine, steps)
        return engine.epsilon_by_accountant()


@pytest.mark.parametrize("mechanism,noise", [("lap2", 1.0), ("dirichlet", 0.2)])
def test_resume_equals_uninterrupted(digits_train, tmp_path, mechanism, noise):
    module, optimizer, loader = build(digits_train, mechanism, seed=7, noise=noise)
    torch.manual_seed(123)
    uninterrupted_epsilon = run(module, optimizer, loader, TOTAL_STEPS)
    uninterrupted = [p.detach().clone() for p in module.parameters()]

    module, optimizer, loader = build(digits_train, mechanism, seed=7, noise=noise)
    torch.manual_seed(123)
    run(module, optimizer, loader, INTERRUPT_AT)
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine, extra={"epoch": 0})
    del module, optimizer, loader

    module, optimizer, loader = build(digits_train, mechanism, seed=99, noise=noise)  # fresh objects
    restored = load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    assert restored == {"epoch": 0, "steps": INTERRUPT_AT}
    resumed_epsilon = run(module, optimizer, loader, TOTAL_STEPS - INTERRUPT_AT)

    engine = optimizer.privacy_engine
    assert engine.steps == TOTAL_STEPS
    assert all(acc.steps == TOTAL_STEPS for acc in engine.accountants.values())
    assert resumed_epsilon == uninterrupted_epsilon
    for resumed, expected in zip(module.parameters(), uninterrupted):
        torch.testing.assert_close(resumed, expected, rtol=0, atol=0)


def test_checkpoint_of_another_setup_is_refused(digits_train, tmp_path):
    module, optimizer, _ = build(digits_train, "lap2", seed=1, noise=1.0)
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    module, optimizer, _ = build(digits_train, "lap2", seed=1, noise=2.0)
    with pytest.raises(CheckpointMismatchError, match="noise=1.0"):
        load_checkpoint(path, module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
