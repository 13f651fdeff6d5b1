"""Shared fixtures: the scikit-learn digits data (bundled, 1437 train / 360 test), one torch thread."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from dpnoise.data import load_dataset


@pytest.fixture(autouse=True)
def one_thread():
    """Tests share two cores with other work: keep torch on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def digits_train() -> Dataset:
    return load_dataset("digits", "train")


@pytest.fixture(scope="session")
def digits_test() -> Dataset:
    return load_dataset("digits", "test")
