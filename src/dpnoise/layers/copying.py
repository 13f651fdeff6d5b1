"""Copying an original layer's weights into the ``nn.Linear`` maps of its replacement."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def copy_linear(linear: nn.Linear, weight: torch.Tensor, bias: Optional[torch.Tensor], frozen: bool) -> None:
    """``linear``'s weight (and bias, where both have one) set to the given values, its parameters trainable
    unless ``frozen`` (the original's were not)."""
    with torch.no_grad():
        linear.weight.copy_(weight)
        if linear.bias is not None and bias is not None:
            linear.bias.copy_(bias)
    linear.requires_grad_(not frozen)
