"""Learned elementwise scales and shifts, CLS tokens and position embeddings, as layers of their own.

Models usually hold these as bare ``nn.Parameter`` s of a larger module (CaiT's and ConvNeXt's layer scale
``x * gamma``, a learned gate, ViT's ``cls_token`` and ``position_embeddings``).  Such a module is a layer of the
model's own, whose forward pass book-keeping cannot read, so its per-example gradients come from re-running it
alone per example (``torch.func``; Hugging Face's ``ViTEmbeddings`` has a source of its own,
:mod:`dpnoise.training.captured_sources`).  Written with the layers below instead, each parameter belongs to a layer
whose function is known, and book-keeping computes its per-example gradients directly from the layer's input
and output gradient (:mod:`dpnoise.training.bookkeeping_rules`)::

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.mlp = nn.Linear(width, width)
            self.layer_scale = Scale(width, init=1e-5)     # was: nn.Parameter(1e-5 * torch.ones(width))

        def forward(self, x):
            return x + self.layer_scale(self.mlp(x))      # was: x + self.gamma * self.mlp(x)

Every layer takes a batch on dimension 0; its parameter is shared by the examples, never broadcast over the batch.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from dpnoise.layers.errors import LayerInputError

Shape = Union[int, tuple[int, ...]]


class Scale(nn.Module):
    """``y = x * weight``, ``weight`` of ``shape`` broadcast against the trailing dimensions of each example.

    ``Scale(d)`` scales the last dimension (layer scale), ``Scale((c, 1, 1))`` the channels of images
    ``(B, c, H, W)``, ``Scale(())`` all of an example by one learned gate.  ``init``: every entry's initial value.
    """

    def __init__(self, shape: Shape, init: float = 1.0, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.weight = nn.Parameter(torch.full(_shape(shape), float(init), device=device, dtype=dtype))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        _check_within_examples(self, self.weight, inputs)
        return inputs * self.weight

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape)}"


class Shift(nn.Module):
    """``y = x + bias``, ``bias`` of ``shape`` broadcast against the trailing dimensions of each example (a learned
    offset; ``Shift((tokens, width))``: position embeddings of sequences that always have ``tokens`` tokens).
    ``init``: every entry's initial value."""

    def __init__(self, shape: Shape, init: float = 0.0, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.bias = nn.Parameter(torch.full(_shape(shape), float(init), device=device, dtype=dtype))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        _check_within_examples(self, self.bias, inputs)
        return inputs + self.bias

    def extra_repr(self) -> str:
        return f"shape={tuple(self.bias.shape)}"


class ClsToken(nn.Module):
    """A learned token put before every sequence: ``(B, T, width)`` -> ``(B, T + 1, width)``, position 0 being
    ``token`` (ViT's ``[CLS]``; initialised as timm initialises it, truncated normal with std 0.02)."""

    def __init__(self, width: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.token = nn.Parameter(nn.init.trunc_normal_(torch.empty(width, device=device, dtype=dtype), std=0.02))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.dim() != 3 or inputs.shape[2] != self.token.numel():
            raise LayerInputError(f"ClsToken({self.token.numel()}) takes sequences (batch, tokens, "
                                  f"{self.token.numel()}), got shape {tuple(inputs.shape)}")
        return torch.cat([self.token.expand(len(inputs), 1, -1), inputs], dim=1)

    def extra_repr(self) -> str:
        return f"width={self.token.numel()}"


class PositionEmbedding(nn.Module):
    """Learned absolute positions added to sequences ``(B, ..., T, width)`` of at most ``max_length`` tokens:
    ``y[..., t, :] = x[..., t, :] + weight[t]`` (truncated normal with std 0.02, as timm initialises ViT's)."""

    def __init__(self, max_length: int, width: int, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(max_length, width, device=device, dtype=dtype),
                                                         std=0.02))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        max_length, width = self.weight.shape
        if inputs.dim() < 3 or inputs.shape[-2] > max_length or inputs.shape[-1] != width:
            raise LayerInputError(f"PositionEmbedding({max_length}, {width}) takes sequences (batch, ..., tokens <= "
                                  f"{max_length}, {width}), got shape {tuple(inputs.shape)}")
        return inputs + self.weight[: inputs.shape[-2]]

    def extra_repr(self) -> str:
        return f"max_length={self.weight.shape[0]}, width={self.weight.shape[1]}"


def _shape(shape: Shape) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _check_within_examples(layer: nn.Module, parameter: torch.Tensor, inputs: torch.Tensor) -> None:
    """Refuse an input with no more dimensions than ``parameter``: broadcasting would align the parameter's first
    dimension with the batch, giving each example its own slice of the parameter instead of all of it."""
    if parameter.dim() >= inputs.dim():
        raise LayerInputError(f"{type(layer).__name__} of shape {tuple(parameter.shape)} needs inputs (batch, ...) "
                              f"with at least {parameter.dim()} dimensions after the batch, got shape "
                              f"{tuple(inputs.shape)}")
