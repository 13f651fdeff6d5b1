"""causal_lm_loss: each sequence's mean next-token loss, then the mean over the sequences."""

import pytest
import torch
from torch.nn import functional as F

from dpnoise.training import causal_lm_loss, per_sequence_causal_lm_losses

VOCAB = 7


def padded_labels() -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(4, 5, VOCAB)`` and labels with -100 at padding and prompts; sequence 3 has no real target."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, VOCAB, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (4, 5), generator=generator)
    labels[0, 3:] = -100  # padding
    labels[1, :2] = -100  # a prompt that is not predicted
    labels[3, 1:] = -100  # only its first token, which nothing predicts
    return logits, labels


def hand_loop(logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Each sequence's mean of -log softmax(logits[t])[labels[t + 1]] over the t with a real label."""
    losses = []
    for sequence_logits, sequence_labels in zip(logits, labels):
        terms = [-F.log_softmax(sequence_logits[t], -1)[sequence_labels[t + 1]]
                 for t in range(len(sequence_labels) - 1) if sequence_labels[t + 1] != -100]
        losses.append(float(sum(terms) / len(terms)) if terms else 0.0)
    return losses


def test_per_sequence_losses_equal_a_hand_loop():
    logits, labels = padded_labels()
    losses = per_sequence_causal_lm_losses(logits, labels)
    assert losses.shape == (4,)
    torch.testing.assert_close(losses, torch.tensor(hand_loop(logits, labels), dtype=torch.float64))
    torch.testing.assert_close(causal_lm_loss(logits, labels), losses.mean())


def test_a_sequence_without_real_tokens_contributes_zero_loss_and_zero_gradient():
    logits, labels = padded_labels()
    logits.requires_grad_(True)
    causal_lm_loss(logits, labels).backward()
    assert per_sequence_causal_lm_losses(logits, labels)[3] == 0
    assert torch.count_nonzero(logits.grad[3]) == 0


def test_each_sequences_gradient_ignores_the_other_sequences_lengths():
    """The property Hugging Face's token mean lacks: padding another sequence more leaves a sequence's gradient."""
    logits, labels = padded_labels()
    repadded = labels.clone()
    repadded[2, 2:] = -100
    gradients = [torch.autograd.grad(causal_lm_loss(logits.requires_grad_(True), some_labels), logits)[0][0]
                 for some_labels in (labels, repadded)]
    torch.testing.assert_close(gradients[0], gradients[1])


def test_one_sequence_equals_hugging_faces_loss():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=8)
    model = transformers.GPT2LMHeadModel(config)
    input_ids = torch.randint(0, VOCAB, (1, 6))
    labels = input_ids.masked_fill(torch.arange(6) < 2, -100)
    outputs = model(input_ids=input_ids, labels=labels)
    torch.testing.assert_close(causal_lm_loss(outputs.logits, labels), outputs.loss)
