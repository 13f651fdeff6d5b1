"""Losses whose per-example gradients are each example's own: the mean over the batch of per-example losses.

DP-SGD clips each example's gradient of *its own* loss, and the engine reads that gradient from the
batch loss as ``batch size * d(batch loss)/d(example)``: exact only when the batch loss is the mean
over the examples of a loss that depends on one example each.  Hugging Face's causal-LM loss
(``outputs.loss`` of a ``...ForCausalLM`` / ``...LMHeadModel`` given ``labels``) is the mean over
all the real tokens of the batch instead: example i's gradient is then scaled by
``B * n_i / (n_1 + ... + n_B)`` (``n_i`` its real tokens), which depends on the other examples'
lengths, so that the clipped gradients, and the sensitivity the accountants assume, are not those of
separate examples.  :func:`causal_lm_loss` averages within each sequence first.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dpnoise.training.per_example_gradients import compute_dtype

#: the label of positions that are not predicted (padding, prompts), as in Hugging Face and PyTorch
IGNORE_INDEX = -100


def per_sequence_causal_lm_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(batch,)`` each sequence's mean next-token cross-entropy over its real tokens (0 for none).

    ``logits``: ``(batch, time, vocab)``; ``labels``: ``(batch, time)`` token ids, ``-100`` where
    nothing is predicted.  Shifted as Hugging Face does: ``logits[:, t]`` predicts ``labels[:, t + 1]``.
    The logits are upcast to float32 at least, as Hugging Face's loss does.
    """
    predictions = logits[:, :-1].to(compute_dtype(logits.dtype))
    targets = labels[:, 1:]
    token_losses = F.cross_entropy(predictions.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    real_tokens = (targets != IGNORE_INDEX).sum(1)
    return token_losses.sum(1) / real_tokens.clamp(min=1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the batch of :func:`per_sequence_causal_lm_losses`: each example's gradient
    depends on that example only (unlike Hugging Face's ``outputs.loss``, the mean over the batch's
    tokens; module docstring).  Pass it as ``loss_fn`` to train causal language models."""
    return per_sequence_causal_lm_losses(logits, labels).mean()
