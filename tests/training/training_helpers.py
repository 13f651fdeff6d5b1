"""Tiny models and loaders for the training tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def mlp(hidden: int = 64, seed: int = 0) -> nn.Module:
    """A small classifier for 1x8x8 digits (no batch-mixing layers)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def digits_loader(dataset: Dataset, batch_size: int = 64) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size)
