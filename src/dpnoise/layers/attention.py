"""Multi-head attention built from ``nn.Linear`` maps, a drop-in replacement for ``nn.MultiheadAttention``.

``nn.MultiheadAttention`` keeps its query, key and value projections in one ``in_proj_weight`` that its
forward multiplies through ``F.multi_head_attention_forward``, so no per-layer rule sees them as linear
maps: book-keeping would re-run the whole layer per example.  :class:`MultiheadAttention` computes the
same function (Vaswani et al. 2017, arXiv 1706.03762, Sec. 3.2.2) with four ``nn.Linear`` layers
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), whose per-example gradients book-keeping gets
exactly, and takes the original's weights (:meth:`MultiheadAttention.from_module`).

Its inputs are moved batch first before the projections, so that every linear map sees the batch in
its first dimension whatever ``batch_first`` is.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.layers.copying import copy_linear
from dpnoise.layers.errors import UnsupportedLayerError


class MultiheadAttention(nn.Module):
    """``nn.MultiheadAttention``'s arguments and forward (the same outputs for the same weights), except
    ``add_bias_kv`` (learned key and value rows shared by every example), which is refused."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if add_bias_kv:
            raise UnsupportedLayerError("MultiheadAttention(add_bias_kv=True) is not supported: its learned key "
                                        "and value rows are not a linear map of each example's input")
        if embed_dim % num_heads:
            raise UnsupportedLayerError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout, self.batch_first, self.add_zero_attn = dropout, batch_first, add_zero_attn
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    @classmethod
    def from_module(cls, original: nn.MultiheadAttention) -> "MultiheadAttention":
        """A copy of ``original`` (its configuration, weights, device, dtype and training mode)."""
        if original.bias_k is not None:
            raise UnsupportedLayerError("MultiheadAttention(add_bias_kv=True) is not supported: its learned key "
                                        "and value rows are not a linear map of each example's input")
        weight = original.out_proj.weight
        layer = cls(original.embed_dim, original.num_heads, dropout=original.dropout,
                    bias=original.in_proj_bias is not None, add_zero_attn=original.add_zero_attn, kdim=original.kdim,
                    vdim=original.vdim, batch_first=original.batch_first, device=weight.device, dtype=weight.dtype)
        if original._qkv_same_embed_dim:
            weights = tuple(original.in_proj_weight.chunk(3))
            frozen = (not original.in_proj_weight.requires_grad,) * 3
        else:
            weights = (original.q_proj_weight, original.k_proj_weight, original.v_proj_weight)
            frozen = tuple(not w.requires_grad for w in weights)
        biases = (None,) * 3 if original.in_proj_bias is None else tuple(original.in_proj_bias.chunk(3))
        for projection, weight, bias, weight_frozen in zip((layer.q_proj, layer.k_proj, layer.v_proj), weights, biases,
                                                            frozen):
            copy_linear(projection, weight, bias, weight_frozen)
        copy_linear(layer.out_proj, original.out_proj.weight, original.out_proj.bias,
                    not original.out_proj.weight.requires_grad)
        return layer.train(original.training)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        batch, target_length, source_length = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = (self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value)))
        if self.add_zero_attn:  # one zero key and value more, which every query may attend to
            k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, self.head_dim)], dim=2)
            v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, self.head_dim)], dim=2)
            source_length += 1
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if attn_mask is None and is_causal:
            attn_mask = torch.ones(target_length, source_length, dtype=torch.bool, device=q.device).triu(1)
        if attn_mask is not None:
            scores = scores + _additive(attn_mask, scores.dtype).reshape(-1, self.num_heads if attn_mask.dim() == 3
                                                                          else 1, target_length, source_length)
        if key_padding_mask is not None:
            scores = scores + _additive(key_padding_mask, scores.dtype).reshape(batch, 1, 1, source_length)
        weights = torch.softmax(scores, dim=-1)
        attended = F.dropout(weights, p=self.dropout, training=self.training) @ v
        output = self.out_proj(attended.transpose(1, 2).reshape(batch, target_length, self.embed_dim))
        if unbatched:
            output, weights = output.squeeze(0), weights.squeeze(0)
        elif not self.batch_first:
            output = output.transpose(0, 1)
        if not need_weights:
            return output, None
        return output, weights.mean(dim=-3) if average_attn_weights else weights

    def _heads(self, projected: torch.Tensor) -> torch.Tensor:
        """(B, L, E) -> (B, heads, L, head_dim)."""
        return projected.reshape(projected.shape[0], projected.shape[1], self.num_heads, self.head_dim).transpose(1, 2)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: not attended) as -inf where True, a float mask as it is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)
