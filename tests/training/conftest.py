"""Shared fixtures: the scikit-learn digits data (bundled, 1437 train / 360 test)."""

from __future__ import annotations

import pytest
from torch.utils.data import Dataset

from dpnoise.data import load_dataset


@pytest.fixture(scope="session")
def digits_train() -> Dataset:
    return load_dataset("digits", "train")


@pytest.fixture(scope="session")
def digits_test() -> Dataset:
    return load_dataset("digits", "test")
