"""A minimal private training loop (used by ``dpnoise train``, the tests and the benchmark)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnoise.training.devices import module_device, module_float_dtype, to_device
from dpnoise.training.engine import PrivacyEngine

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step saw (``step`` counts from 1, across resumes)."""

    step: int
    loss: float
    batch_accuracy: float
    batch_size: int


def endless_batches(loader: DataLoader) -> Iterator:
    """The loader's batches, epoch after epoch (Poisson batches are i.i.d. across steps)."""
    while True:
        yield from loader


def train_step(
    module: nn.Module, optimizer: Optimizer, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: LossFunction
) -> tuple[float, float, int]:
    """One forward/backward/step on ``batch``; returns (loss, batch accuracy, batch size)."""
    inputs, targets = batch
    module.train()
    optimizer.zero_grad()
    outputs = module(inputs)
    # An empty Poisson batch still takes a (pure-noise) step: zero loss, zero gradient signal.
    loss = loss_fn(outputs, targets) if len(targets) else outputs.sum() * 0.0
    loss.backward()
    optimizer.step()
    accuracy = (outputs.argmax(dim=-1) == targets).float().mean().item() if len(targets) else 0.0
    return loss.item(), accuracy, len(targets)


def train_steps(
    module: nn.Module,
    optimizer: Optimizer,
    batches: Iterator,
    engine: PrivacyEngine,
    num_steps: int,
    *,
    loss_fn: LossFunction = F.cross_entropy,
    on_step: Optional[Callable[[StepMetrics], None]] = None,
) -> list[StepMetrics]:
    """Take up to ``num_steps`` optimizer steps; stop early if the engine's budget is exhausted.

    With physical batches (``make_private(max_physical_batch_size=...)``) a step takes as many
    batches as its logical batch has; its metrics are over the whole logical batch.
    """
    history = []
    physical: list[tuple[float, float, int]] = []
    while len(history) < num_steps:
        steps_before = engine.steps
        physical.append(train_step(module, optimizer, next(batches), loss_fn))
        if engine.budget_exhausted:
            break
        if engine.steps == steps_before:  # a physical batch was accumulated; the step is not over
            continue
        metrics = StepMetrics(engine.steps, *logical_batch_metrics(physical))
        physical.clear()
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    return history


def logical_batch_metrics(physical: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """(loss, accuracy, size) of a logical batch from those of its physical batches (size-weighted means)."""
    if len(physical) == 1:
        return physical[0]
    size = sum(n for _, _, n in physical)
    if not size:
        return 0.0, 0.0, 0
    return (sum(loss * n for loss, _, n in physical) / size, sum(acc * n for _, acc, n in physical) / size, size)


@torch.no_grad()
def count_correct(module: nn.Module, batches: Iterable) -> tuple[int, int]:
    """(correct top-1 predictions, examples) of ``module`` (in eval mode) over ``batches`` of
    (inputs, targets), each moved to the module's device (floating inputs in its dtype)."""
    module.eval()
    device, dtype = module_device(module), module_float_dtype(module)
    correct = total = 0
    for inputs, targets in batches:
        inputs, targets = to_device((inputs, targets), device, dtype)
        correct += (module(inputs).argmax(dim=-1) == targets).sum().item()
        total += len(targets)
    return correct, total


def evaluate_accuracy(module: nn.Module, batches: Iterable) -> float:
    """Top-1 accuracy of ``module`` (in eval mode) over ``batches`` of (inputs, targets)."""
    correct, total = count_correct(module, batches)
    return correct / total
