"""Frozen pretrained encoders under a trainable head, and their features computed once and cached.

DP training of a head on frozen public features only needs per-example gradients of the head, so
the encoder runs once over the data (outside the private loop) instead of at every step.  A model
qualifies by exposing ``features(inputs)``, a trainable ``head`` and a ``feature_cache_tag``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpnoise.data.paths import cache_dir


@runtime_checkable
class FeatureClassifier(Protocol):
    """A frozen encoder (``features``) under a trainable ``head``."""

    head: nn.Module

    def features(self, inputs: torch.Tensor) -> torch.Tensor: ...

    @property
    def feature_cache_tag(self) -> tuple[str, str]:
        """(file-name stem, salt): the salt names everything besides the inputs that fixes the features."""
        ...


def features_cache_file(model: FeatureClassifier, inputs: torch.Tensor, labels: torch.Tensor) -> Path:
    """Cache path keyed by the exact input tensors and the model's tag."""
    stem, salt = model.feature_cache_tag
    digest = hashlib.sha256()
    for tensor in (inputs, labels):
        digest.update(memoryview(tensor.contiguous().numpy()).cast("B"))
    digest.update(salt.encode())
    return cache_dir() / "features" / f"{stem}-{digest.hexdigest()[:20]}.pt"


def extract_features(
    model: FeatureClassifier,
    dataset: TensorDataset,
    batch_size: int = 64,
    cache: bool = True,
    progress: bool = False,
) -> TensorDataset:
    """Run the frozen encoder once over ``dataset`` and return ``TensorDataset(features, labels)``.

    Features are rounded to float16 precision (and returned as float32), so cached and fresh results
    are equal; with ``cache`` they are stored under ``$DPNOISE_CACHE/features`` and reused.
    """
    inputs, labels = dataset.tensors
    path = features_cache_file(model, inputs, labels) if cache else None
    if path is not None and path.is_file():
        return TensorDataset(torch.load(path, weights_only=True).float(), labels)
    # Models whose cost grows with the longest input in a batch (text) give an order that groups
    # inputs of similar size; the features are put back in dataset order.
    order = model.batching_order(inputs) if hasattr(model, "batching_order") else torch.arange(len(inputs))
    batches = range(0, len(inputs), batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=f"{model.feature_cache_tag[0]} features", unit="batch")
    with torch.no_grad():
        computed = torch.cat([model.features(inputs[order[i : i + batch_size]]).half() for i in batches])
    features = torch.empty_like(computed)
    features[order] = computed
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(features, tmp)
        tmp.replace(path)
    return TensorDataset(features.float(), labels)
