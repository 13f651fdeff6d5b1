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
