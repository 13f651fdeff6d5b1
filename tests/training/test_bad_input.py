"""Bad input fails early with a message that says what is wrong."""

import pytest
import torch
from torch import nn

from dpnoise.accounting import UnreachableTargetError
from dpnoise.training import PrivacyBudgetExceededError, UnsupportedLayerError, make_private

from training_helpers import digits_loader, mlp


def make(dataset, model=None, **options):
    model = model or mlp(hidden=8)
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(dataset, 64),
                        **{"delta": 1e-5, **options})


@pytest.mark.parametrize("mechanism", ["lap2", "dirichlet"])
def test_batch_norm_is_refused_by_name(digits_train, mechanism):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    with pytest.raises(UnsupportedLayerError, match=r"2 \(BatchNorm1d\): batch statistics"):
        make(digits_train, model, mechanism=mechanism, noise=1.0)


def test_layer_opacus_cannot_handle_is_refused_by_name(digits_train):
    class WithLstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.LSTM(8, 8, batch_first=True)
            self.head = nn.Linear(8, 10)

    with pytest.raises(UnsupportedLayerError, match=r"encoder \(LSTM\)"):
        make(digits_train, WithLstm(), mechanism="gaussian", noise=1.0)


def test_epsilon_below_the_reachable_floor(digits_train):
    with pytest.raises(UnreachableTargetError, match="unreachable"):
        make(digits_train, mechanism="dirichlet", target_epsilon=0.05, epochs=50)
    with pytest.raises(PrivacyBudgetExceededError, match="even one step"):
        make(digits_train, mechanism="gaussian", noise=0.3, target_epsilon=0.01)


def test_inconsistent_options(digits_train):
    with pytest.raises(ValueError, match="unknown mechanism 'laplace'"):
        make(digits_train, mechanism="laplace", noise=1.0)
    with pytest.raises(ValueError, match="noise=, or target_epsilon= and epochs="):
        make(digits_train, mechanism="lap2", target_epsilon=1.0)
    with pytest.raises(ValueError, match="alpha is a Dirichlet parameter"):
        make(digits_train, mechanism="lap2", noise=1.0, alpha=1.0)
    with pytest.raises(ValueError, match="does not apply to mechanism 'lap2'"):
        make(digits_train, mechanism="lap2", noise=1.0, accountant="gaussian")


def test_fixed_size_batches_are_warned_as_not_covered(digits_train):
    with pytest.warns(UserWarning, match="accountants assume Poisson sampling"):
        _, _, loader = make(digits_train, mechanism="lap2", noise=1.0, poisson_sampling=False)
    assert len(next(iter(loader))[1]) == 64
