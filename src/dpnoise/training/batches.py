"""What a training batch is: an ``(inputs, targets)`` pair, or a dict of a model's keyword arguments.

Hugging Face models take their batches as keyword arguments (``input_ids``, ``attention_mask``,
``token_type_ids``, ``labels``) and return an output object whose ``logits`` (and, given the
labels, ``loss``: the mean over the batch's examples for sequence classification) are read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from dpnoise.training.errors import InvalidTrainingOptionError

#: the key of the labels in a dict batch (what Hugging Face models and collators use)
LABELS = "labels"

#: a training loss ``loss_fn(logits, labels)``: the mean over the batch's examples
LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_loss_fn(loss_fn: Any) -> None:
    """Refuse a ``loss_fn`` that is neither None nor callable (the error names it)."""
    if loss_fn is not None and not callable(loss_fn):
        raise InvalidTrainingOptionError(f"loss_fn must be None or a function loss_fn(logits, labels), got a "
                                         f"{type(loss_fn).__name__}")


def map_tensors(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (tensors nested in tuples, lists and mappings) with ``change`` applied to each of its tensors;
    anything else as it is."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, Mapping):
        return {key: map_tensors(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(item, change) for item in value)
    return value


def leading_size(value: Any) -> Optional[int]:
    """The leading dimension of the first tensor in ``value`` (nested tuples, lists, mappings) that has one,
    or None (a batch's number of examples)."""
    if isinstance(value, torch.Tensor):
        return len(value) if value.dim() else None
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        size = leading_size(item)
        if size is not None:
            return size
    return None


def is_keyword_batch(batch: Any) -> bool:
    """True for a dict batch (the model's keyword arguments), False for an ``(inputs, targets)`` pair."""
    return isinstance(batch, Mapping)


def batch_labels(batch: Any) -> torch.Tensor:
    """The labels of ``batch``: ``batch["labels"]`` of a dict batch, the second entry of a pair."""
    if not is_keyword_batch(batch):
        return batch[1]
    if LABELS not in batch:
        hint = " (rename 'label' to 'labels', as Hugging Face's DataCollatorWithPadding does)" if "label" in batch else ""
        raise InvalidTrainingOptionError(
            f"dict batches need their labels under 'labels'{hint}: the loss is the model's own (outputs.loss), "
            f"which Hugging Face models compute from them; got the keys {', '.join(map(str, batch)) or 'none'}")
    return batch[LABELS]


def check_batch_format(data_loader: DataLoader, *, perturbs_gradients: bool) -> None:
    """Refuse, before any step, a data loader whose examples collate into a dict batch without labels,
    or into any dict batch for a mechanism that perturbs the model's outputs (``perturbs_gradients``
    False): those mechanisms replace the logits a model returns, and a Hugging Face model given the
    labels would compute its own loss from the unperturbed ones."""
    collate: Callable[[list], Any] = data_loader.collate_fn or default_collate
    batch = collate([data_loader.dataset[0]])
    if not is_keyword_batch(batch):
        return
    if not perturbs_gradients:
        raise InvalidTrainingOptionError(
            "dict batches (Hugging Face models) train with the gradient mechanisms only; the output mechanisms "
            "perturb the logits of a model called on the inputs of (inputs, targets) batches")
    batch_labels(batch)


def model_logits(outputs: Any) -> torch.Tensor:
    """The logits of a model's outputs: ``outputs.logits`` (Hugging Face models), or the outputs themselves."""
    return getattr(outputs, "logits", outputs)


def run_model(module: torch.nn.Module, batch: Any, with_labels: bool = True) -> Any:
    """``module(**batch)`` for a dict batch (without its labels unless ``with_labels``), else ``module(inputs)``."""
    if not is_keyword_batch(batch):
        return module(batch[0])
    return module(**(batch if with_labels else {k: v for k, v in batch.items() if k != LABELS}))


def batch_loss(outputs: Any, batch: Any, loss_fn: Optional[LossFunction]) -> torch.Tensor:
    """``loss_fn(logits, labels)`` when given; otherwise the model's ``outputs.loss`` for a dict batch
    and the cross-entropy of the logits for a pair."""
    if loss_fn is not None:
        return loss_fn(model_logits(outputs), batch_labels(batch))
    if is_keyword_batch(batch):
        return outputs.loss
    return torch.nn.functional.cross_entropy(model_logits(outputs), batch_labels(batch))
