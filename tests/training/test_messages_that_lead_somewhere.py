"""Refusals of what users bring from other libraries name the dpnoise way to do it."""

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import InvalidTrainingOptionError, make_private
from dpnoise.training.errors import UnsupportedLayerError

DATA = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))


def private(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_private(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
                            DataLoader(DATA, batch_size=16), mechanism="gaussian", noise_multiplier=1.0, delta=1e-5,
                            seed=0, noise_seed=0)


def test_opacus_batch_memory_manager_points_to_max_physical_batch_size():
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    module, optimizer, loader = private(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    with pytest.raises(InvalidTrainingOptionError, match=r"make_private\(\.\.\., max_physical_batch_size=N\)"):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=4, optimizer=optimizer) as batches:
            for x, y in batches:
                optimizer.zero_grad()
                nn.functional.cross_entropy(module(x), y).backward()
                optimizer.step()


def test_batch_norm_points_to_fix_model_and_freeze_batchnorms():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    with pytest.raises(UnsupportedLayerError, match=r"fix_model\(model\).*dpnoise\.models\.freeze_batchnorms\(model\)"):
        private(model)
