"""A private run's arguments checked without an engine (training/validation.py check_private_run)."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.execution import ExecutionOptions
from dpnoise.training.privacy_plan import PrivacyOptions
from dpnoise.training.validation import check_private_run

GAUSSIAN = PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0)


def run_parts(examples: int = 40) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    model = nn.Linear(4, 2)
    data = TensorDataset(torch.randn(examples, 4), torch.randint(0, 2, (examples,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=8)


def test_a_checked_run_says_where_it_runs_and_under_which_mechanism():
    run = check_private_run(*run_parts(), privacy=GAUSSIAN, execution=ExecutionOptions(), loss_fn=None,
                            noise_seed=None)
    assert run.device == torch.device("cpu") and run.group is None
    assert run.mechanism.needs_per_sample_gradients


def test_options_of_another_type_are_refused():
    with pytest.raises(InvalidTrainingOptionError, match="privacy must be a PrivacyOptions"):
        check_private_run(*run_parts(), privacy={"mechanism": "gaussian"}, execution=ExecutionOptions(),
                          loss_fn=None, noise_seed=None)


def test_an_empty_dataset_is_refused_before_any_work():
    with pytest.raises(InvalidTrainingOptionError, match="dataset is empty"):
        check_private_run(*run_parts(examples=0), privacy=GAUSSIAN, execution=ExecutionOptions(), loss_fn=None,
                          noise_seed=None)


def test_secure_mode_refuses_the_engines_noise_seed():
    secure = PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, secure_mode=True)
    with pytest.raises(InvalidTrainingOptionError, match="noise_seed"):
        check_private_run(*run_parts(), privacy=secure, execution=ExecutionOptions(), loss_fn=None, noise_seed=3)
