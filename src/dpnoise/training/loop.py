"""A minimal private training loop (used by ``dpnoise train``, the tests and the benchmark)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnoise.training.batches import LossFunction, batch_labels, batch_loss, is_keyword_batch, model_logits, run_model
from dpnoise.training.devices import module_device, module_float_dtype, to_device
from dpnoise.training.engine import PrivacyEngine



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
    module: nn.Module, optimizer: Optimizer, batch: Any, loss_fn: Optional[LossFunction] = None
) -> tuple[float, float, int]:
    """One forward/backward/step on ``batch``; returns (loss, batch accuracy, batch size).

    ``batch``: an ``(inputs, targets)`` pair, or a dict of the model's keyword arguments with
    ``labels`` (Hugging Face models: ``module(**batch)``).  The loss is ``loss_fn(logits, labels)``
    when given, else the model's own ``outputs.loss`` (dict batches) or the cross-entropy (pairs);
    the logits are ``outputs.logits`` where the model returns an object holding them.
    """
    targets = batch_labels(batch)
    module.train()
    optimizer.zero_grad()
    if not len(targets) and is_keyword_batch(batch):
        # An empty Poisson batch still takes its (noise-only) step; Hugging Face models cannot run on
        # zero examples, and the optimizer knows from the loader that there is nothing to clip.
        optimizer.step()
        return 0.0, 0.0, 0
    outputs = run_model(module, batch)
    logits = model_logits(outputs)
    # An empty batch of a pair: zero loss, zero gradient signal.
    loss = batch_loss(outputs, batch, loss_fn) if len(targets) else logits.sum() * 0.0
    loss.backward()
    optimizer.step()
    accuracy = (logits.argmax(dim=-1) == targets).float().mean().item() if len(targets) else 0.0
    return loss.item(), accuracy, len(targets)


def train_steps(
    module: nn.Module,
    optimizer: Optimizer,
    batches: Iterator,
    engine: PrivacyEngine,
    num_steps: int,
    *,
    loss_fn: Optional[LossFunction] = None,
    on_step: Optional[Callable[[StepMetrics], None]] = None,
) -> list[StepMetrics]:
    """Take up to ``num_steps`` optimizer steps; stop early if the engine's budget is exhausted.

    ``loss_fn(logits, labels)``: default the model's own loss for dict batches (Hugging Face
    models given ``labels``), the cross-entropy for ``(inputs, targets)`` pairs (:func:`train_step`).

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
    (inputs, targets), or dicts of keyword arguments with ``labels`` (run without them), each moved
    to the module's device (floating inputs in its dtype)."""
    module.eval()
    device, dtype = module_device(module), module_float_dtype(module)
    correct = total = 0
    for batch in batches:
        batch = to_device(batch, device, dtype)
        targets = batch_labels(batch)
        if not len(targets):
            continue
        logits = model_logits(run_model(module, batch, with_labels=False))
        correct += (logits.argmax(dim=-1) == targets).sum().item()
        total += len(targets)
    return correct, total


def evaluate_accuracy(module: nn.Module, batches: Iterable) -> float:
    """Top-1 accuracy of ``module`` (in eval mode) over ``batches`` of (inputs, targets) or dict batches."""
    correct, total = count_correct(module, batches)
    return correct / total
