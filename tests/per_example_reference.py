"""The reference every per-example gradient is tested against: one backward pass per example."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def single_example_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Per-parameter ``(batch, *shape)`` cross-entropy gradients, one backward pass per example."""
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append([p.grad.clone() for p in model.parameters()])
    return [torch.stack(per_param) for per_param in zip(*rows)]


def per_example_gradients(params: list[torch.Tensor], example_loss, batch: int) -> list[torch.Tensor]:
    """Per-parameter ``(batch, *shape)`` gradients of ``example_loss(i)``, one backward pass per example
    (zeros where the loss does not reach a parameter, as autograd leaves it without a gradient)."""
    rows = [[torch.zeros_like(p) if g is None else g
             for p, g in zip(params, torch.autograd.grad(example_loss(i), params, allow_unused=True))]
            for i in range(batch)]
    if not rows:
        return [torch.zeros(0, *p.shape, dtype=p.dtype) for p in params]
    return [torch.stack(per_param) for per_param in zip(*rows)]


def tanh_losses(inputs, weights):
    """Per-example losses ``sum(w_i * tanh(layer(x_i)))``: arbitrary, non-linear output gradients."""
    def losses(module, examples):
        return (weights[examples] * torch.tanh(module(inputs[examples]))).flatten(1).sum(1)
    return losses


def layer_case(layer, inputs):
    """``layer`` in float64 and per-example losses of it with random weights (:func:`tanh_losses`)."""
    layer = layer.double()
    with torch.no_grad():
        weights = torch.randn_like(layer(inputs).double())
    return layer, tanh_losses(inputs, weights)
