"""What a training batch is: an ``(inputs, targets)`` pair, or a dict of a model's keyword arguments.

Hugging Face models take their batches as keyword arguments (``input_ids``, ``attention_mask``,
``token_type_ids``, ``labels``) and return an output object whose ``logits`` (and, given the
labels, ``loss``: the mean over the batch's examples for sequence classification) are read here.
What the ids and labels of a dict batch must be for its model (:func:`keyword_batch_rules`) is
checked before the model sees them (:func:`check_keyword_batch`): a float label or token id, or one
out of range, would otherwise fail deep inside torch or transformers at the first step.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.losses import IGNORE_INDEX

#: the key of the labels in a dict batch (what Hugging Face models and collators use)
LABELS = "labels"

#: the ending of the keys of a dict batch that hold indices (``input_ids``, ``token_type_ids``, ``position_ids``)
IDS_SUFFIX = "_ids"

#: endings of the class names of Hugging Face's causal language models (their labels are token ids)
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")

#: endings of the class names of Hugging Face's classifiers (their labels are class indices below
#: ``config.num_labels``)
CLASSIFIER_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification")

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


def first_example_batch(data_loader: DataLoader) -> Any:
    """The loader's first example, collated as the loader collates its batches (a batch of one)."""
    collate: Callable[[list], Any] = data_loader.collate_fn or default_collate
    return collate([data_loader.dataset[0]])


def check_batch_format(data_loader: DataLoader, *, perturbs_gradients: bool, rules: KeywordBatchRules) -> None:
    """Refuse, before any step, a data loader whose examples collate into a dict batch without labels,
    or that breaks ``rules`` (:func:`check_keyword_batch`, on its first example), or into any dict batch
    for a mechanism that perturbs the model's outputs (``perturbs_gradients`` False): those mechanisms
    replace the logits a model returns, and a Hugging Face model given the labels would compute its own
    loss from the unperturbed ones."""
    batch = first_example_batch(data_loader)
    if not is_keyword_batch(batch):
        return
    if not perturbs_gradients:
        raise InvalidTrainingOptionError(
            "dict batches (Hugging Face models) train with the gradient mechanisms only; the output mechanisms "
            "perturb the logits of a model called on the inputs of (inputs, targets) batches")
    batch_labels(batch)
    check_keyword_batch(batch, rules)


@dataclass(frozen=True)
class IndexRange:
    """Integer indices in [0, ``size``), :data:`IGNORE_INDEX` too where ``ignorable``; ``source`` says
    where the size comes from (for the messages)."""

    size: int
    source: str
    ignorable: bool = False


@dataclass(frozen=True)
class KeywordBatchRules:
    """What the ids and labels of a model's dict batches must be (:func:`keyword_batch_rules`); every
    ``*_ids`` tensor must hold integers whatever the model."""

    #: the range of ``labels`` (None: not known, any labels pass)
    labels: Optional[IndexRange] = None
    #: float labels of shape ``(batch, labels.size)`` pass: multi-label targets, from which a Hugging Face
    #: classifier without a ``config.problem_type`` infers its loss
    multi_label_floats: bool = False
    #: the range of ``input_ids`` (None: not known)
    input_ids: Optional[IndexRange] = None


def hugging_face_model(model: nn.Module) -> Optional[nn.Module]:
    """The transformers model that ``model`` is, or that peft wraps in it; None for any other model.
    transformers is never imported here: a Hugging Face model has imported it."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return None
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return base if isinstance(base, transformers.PreTrainedModel) else None


def is_hugging_face_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` (or the model peft wraps in it) is a transformers causal language model."""
    base = hugging_face_model(model)
    return base is not None and type(base).__name__.endswith(CAUSAL_LM_SUFFIXES)


def keyword_batch_rules(model: nn.Module) -> KeywordBatchRules:
    """The ranges of a Hugging Face model's ``input_ids`` (its input embeddings) and labels: a causal
    language model's token ids (its output layer), a classifier's class indices (``config.num_labels``,
    unless its ``config.problem_type`` is regression or multi-label, or it has one label: regression);
    -100 (ignored by their losses) in both.  Nothing is known of other models."""
    base = hugging_face_model(model)
    if base is None:
        return KeywordBatchRules()
    name = type(base).__name__
    inputs = _embedding_layer(base, "get_input_embeddings")
    input_ids = (IndexRange(inputs.num_embeddings, f"the input embeddings of {name}")
                 if isinstance(inputs, nn.Embedding) else None)
    if name.endswith(CAUSAL_LM_SUFFIXES):
        outputs = _embedding_layer(base, "get_output_embeddings")
        if isinstance(outputs, nn.Linear):
            return KeywordBatchRules(IndexRange(outputs.out_features, f"the output layer of {name}", ignorable=True),
                                     input_ids=input_ids)
    problem, classes = getattr(base.config, "problem_type", None), getattr(base.config, "num_labels", 0)
    if name.endswith(CLASSIFIER_SUFFIXES) and (problem == "single_label_classification"
                                               or (problem is None and classes > 1)):
        return KeywordBatchRules(IndexRange(classes, f"config.num_labels of {name}", ignorable=True),
                                 multi_label_floats=problem is None, input_ids=input_ids)
    return KeywordBatchRules(input_ids=input_ids)


def _embedding_layer(model: nn.Module, getter: str) -> Optional[nn.Module]:
    """``model.<getter>()`` (a Hugging Face model's input or output embeddings), None where it has none."""
    try:
        return getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None


def check_keyword_batch(batch: Any, rules: KeywordBatchRules) -> None:
    """Refuse a dict batch whose ``*_ids`` are not integers, or whose ``labels`` and ``input_ids`` break
    ``rules`` (not integers, or out of their range), naming the key; any other batch passes."""
    if not is_keyword_batch(batch):
        return
    for key, value in batch.items():
        if isinstance(key, str) and key.endswith(IDS_SUFFIX) and isinstance(value, torch.Tensor) \
                and not _holds_integers(value):
            raise InvalidTrainingOptionError(f"dict batches: {key!r} must hold integer indices (token ids), got "
                                             f"{value.dtype}")
    if rules.input_ids is not None and isinstance(batch.get("input_ids"), torch.Tensor):
        _check_range("input_ids", batch["input_ids"], rules.input_ids)
    labels = batch.get(LABELS)
    if rules.labels is None or not isinstance(labels, torch.Tensor):
        return
    if not _holds_integers(labels):
        if rules.multi_label_floats and labels.dim() == 2 and labels.shape[-1] == rules.labels.size:
            return
        raise InvalidTrainingOptionError(f"dict batches: {LABELS!r} must hold integer class indices in "
                                         f"{_described(rules.labels)} for the model's loss, got {labels.dtype}")
    _check_range(LABELS, labels, rules.labels)


def _holds_integers(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s dtype is an integer one (not floating, complex or bool)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _check_range(key: str, tensor: torch.Tensor, allowed: IndexRange) -> None:
    """Refuse integer ``tensor`` (the batch's ``key``) with an entry outside ``allowed``."""
    counted = tensor[tensor != IGNORE_INDEX] if allowed.ignorable else tensor
    if counted.numel() == 0:
        return
    low, high = int(counted.min()), int(counted.max())
    if low < 0 or high >= allowed.size:
        raise InvalidTrainingOptionError(f"dict batches: {key!r} must be in {_described(allowed)}, got "
                                         f"{low if low < 0 else high}")


def _described(allowed: IndexRange) -> str:
    """``[0, size) (where the size comes from[, or -100: ignored])``."""
    ignored = f", or {IGNORE_INDEX}: ignored" if allowed.ignorable else ""
    return f"[0, {allowed.size}) ({allowed.source}{ignored})"


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
