"""The epsilons a private run reports: an unsound accountant warns only when the user chose it."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dpnoise import make_private
from dpnoise.accounting import ACCOUNTANTS, UnsoundAccountantWarning


def one_lap2_step(**options):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    data = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    model, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                            DataLoader(data, batch_size=8), mechanism="lap2", laplace_scale=2.0,
                                            delta=1e-5, seed=0, **options)
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    return optimizer.privacy_engine


def test_side_by_side_unsound_epsilon_comes_without_a_warning():
    engine = one_lap2_step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsoundAccountantWarning)
        by_accountant = engine.epsilon_by_accountant()
    assert "lap2-paper" in by_accountant and not ACCOUNTANTS["lap2-paper"].sound
    assert by_accountant["lap2"] == engine.get_epsilon() > 0


def test_a_chosen_unsound_accountant_still_warns():
    with pytest.warns(UnsoundAccountantWarning):
        engine = one_lap2_step(accountant="lap2-paper")
    with pytest.warns(UnsoundAccountantWarning, match="lap2-paper"):
        engine.epsilon_by_accountant()
