"""Exact per-example gradients of the layers that Opacus 1.6's grad samplers get wrong or lack, for both sources.

Opacus's samplers, compared with one-example-at-a-time autograd:

* a convolution with ``padding_mode`` "reflect", "replicate" or "circular" is sampled as if its input
  were zero-padded (per-example norms 2-3 % off, clipped sums 11-23 %);
* ``nn.Embedding(padding_idx=k)`` gives row k a per-example gradient (autograd gives it none);
* ``nn.EmbeddingBag`` counts an id repeated in a bag once (``gsm[i][ids] += g``), ignores
  ``padding_idx``, ``per_sample_weights``, ``include_last_offset`` and mode "max", and crashes on 2-D
  input.

:data:`GRAD_SAMPLERS` is Opacus's registry with those layer types computed here instead (Opacus's own
registry is left as it is); book-keeping's recorded layers and :class:`ExactGradSampleModule`, the
``GradSampleModule`` of ``grad_sample_mode="hooks"``, both use it:

* convolutions (any padding mode, int, tuple or string padding): the input padded explicitly as the
  layer's forward pads it (``F.pad`` in its padding mode), then Opacus's sampler for zero padding
  on a padding-0 copy of the layer (PyTorch's ``_ConvNd.forward`` computes the same two steps);
* ``nn.Embedding``: book-keeping's token-id rows (:class:`~dpnoise.training.bookkeeping_rules.EmbeddingRule`,
  the padding row left out), materialised;
* ``nn.EmbeddingBag`` (modes "sum", "mean", "max"; 1-D input with offsets, with or without
  ``include_last_offset``, or 2-D input; ``per_sample_weights``; ``padding_idx``): each bag is an
  example; :func:`embedding_bag_rows` gives its gradient as token-id rows, which book-keeping keeps
  and the hooks materialise;
* ``nn.ConvTranspose1d``/``2d`` (every stride, padding, output padding, dilation and groups) and ``nn.PReLU``
  (one slope or one per channel), which Opacus has no sampler for
  (:func:`conv_transpose_per_example_gradients`, :func:`prelu_grad_sample`).

:func:`per_example_gradient_problems` names the layers that neither source computes exactly; they are
refused before training.
"""

from __future__ import annotations

import copy
from collections import ChainMap
from typing import Optional

import torch
from opacus import GradSampleModule
from torch.utils._pytree import tree_leaves
from opacus.grad_sample.conv import compute_conv_grad_sample
from opacus.layers.dp_rnn import DPRNNBase, RNNLinear
from torch import nn
from torch.nn import functional as F

from dpnoise.layers import EQUIVALENTS
from dpnoise.training.bookkeeping_rules import EmbeddingRule
from dpnoise.training.per_example_gradients import IndexedRows

#: Opacus's replacements and their ``RNNLinear`` layers (hooks only), which handle their own batches:
#: a call per time step, of the examples still running in a packed sequence
OPACUS_RECURRENT_LAYERS = (DPRNNBase, RNNLinear)


def per_example_gradient_problems(layer: nn.Module) -> list[str]:
    """Why neither gradient source gives ``layer``'s exact per-example gradients (empty: both can)."""
    if type(layer) in EQUIVALENTS:
        name = type(layer).__name__
        return [f"{name}'s fused kernel has no per-example gradients; replace it with dpnoise.layers.{name}, the "
                f"same function from linear maps with the same weights, which book-keeping covers exactly "
                f"(dpnoise.layers.fix_model(model) swaps every such layer in)"]
    reasons = []
    if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        if layer.max_norm is not None:
            reasons.append("max_norm renormalises the weight in place during the forward pass")
        if layer.scale_grad_by_freq:
            reasons.append("scale_grad_by_freq divides gradients by the batch's token counts, mixing examples")
    return reasons


# ------------------------------------------------------------------------------------ convolutions
def padded_conv_input(layer: nn.modules.conv._ConvNd, inputs: torch.Tensor) -> torch.Tensor:
    """``inputs`` padded as ``layer``'s forward pads them (its padding mode; asymmetric for "same")."""
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F.pad(inputs, layer._reversed_padding_repeated_twice, mode=mode)


def unpadded_conv(layer: nn.modules.conv._ConvNd) -> nn.modules.conv._ConvNd:
    """A shallow copy of ``layer`` (the same parameters) without padding, for explicitly padded inputs."""
    view = copy.copy(layer)
    view.padding, view.padding_mode = (0,) * len(layer.kernel_size), "zeros"
    return view


def conv_grad_sample(layer: nn.modules.conv._ConvNd, activations: list[torch.Tensor],
                     backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a ``Conv1d``/``Conv2d``/``Conv3d`` in any padding mode: Opacus's zero-padding
    sampler on the explicitly padded input (contiguous: Opacus's ``unfold2d`` reads it as if it were)."""
    return compute_conv_grad_sample(unpadded_conv(layer), [padded_conv_input(layer, activations[0]).contiguous()],
                                    backprops)


def window_weight_gradients(padded: torch.Tensor, output_grad: torch.Tensor, kernel_size: tuple[int, int],
                            stride: tuple[int, int], dilation: tuple[int, int], groups: int) -> torch.Tensor:
    """Per-example weight gradients of the 2-D convolution of an already padded input, ``(batch, out, kh, kw, k)``.

    ``G_i[o, u, v, c] = sum_{h,w} g_i[o, h, w] x_i[k c_o + c, s_h h + d_h u, s_w w + d_w v]`` (``x_i``: ``padded``,
    ``g_i``: ``output_grad``, ``k`` input channels per group, ``c_o`` the group of ``o``).  One batched matmul per
    (example, group) over a channels-last sliding-window view: the windows are copied once, contiguous along
    channels, and the result needs no transpose (Opacus's ``unfold2d`` + einsum copies both, and its grouped einsum
    is about 27 times slower on EfficientNet-Lite0's depthwise convolutions, benchmarks/bench_efficientnet.py).
    """
    n, out_channels, out_h, out_w = output_grad.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, stride, dilation
    in_per_group = padded.shape[1] // groups
    channels_last = padded.permute(0, 2, 3, 1).contiguous()
    stride_n, stride_h, stride_w, stride_c = channels_last.stride()
    windows = channels_last.as_strided(
        (n, out_h, out_w, kh, kw, groups, in_per_group),
        (stride_n, stride_h * sh, stride_w * sw, stride_h * dh, stride_w * dw, stride_c * in_per_group, stride_c),
    ).permute(0, 5, 1, 2, 3, 4, 6).reshape(n * groups, out_h * out_w, kh * kw * in_per_group)
    weight = torch.bmm(output_grad.reshape(n * groups, out_channels // groups, out_h * out_w), windows)
    return weight.view(n, out_channels, kh, kw, in_per_group)


def conv_transpose_per_example_gradients(layer: nn.modules.conv._ConvTransposeNd, activations: torch.Tensor,
                                         backprops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example (weight, bias) gradients of a ``ConvTranspose1d``/``2d``: weight
    ``(batch, in, kh, kw, out / groups)`` (``kh = 1`` for 1-D), bias ``(batch, out)``.

    The transposed convolution adds ``x[c, h] W[c, o, u]`` into output position ``s h + d u - p``, so
    ``dL/dW[c, o, u] = sum_h x[c, h] g~[o, s h + d u]`` with ``g~`` the output gradient zero-padded by ``p`` on each
    side (the positions the layer crops): the weight gradient of the ordinary convolution of ``g~`` (same
    stride, dilation and groups) whose output gradient is ``x`` (:func:`window_weight_gradients`).  Output
    padding only appends output positions, which the windows of the ``x`` positions reach as the layer's
    forward did; bias: ``sum_h g[o, h]``.
    """
    padded = padded_conv_input(layer, backprops)  # zero padding, the only mode a transposed convolution has
    geometry = (layer.kernel_size, layer.stride, layer.dilation)
    if len(layer.kernel_size) == 1:  # a 1-D convolution is a 2-D one over a height of 1
        padded, activations = padded.unsqueeze(2), activations.unsqueeze(2)
        geometry = tuple((1, *values) for values in geometry)
    weight = window_weight_gradients(padded, activations, *geometry, layer.groups)
    return weight, backprops.flatten(2).sum(2)


def conv_transpose_grad_sample(layer: nn.modules.conv._ConvTransposeNd, activations: list[torch.Tensor],
                               backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """:func:`conv_transpose_per_example_gradients` in the parameters' shapes."""
    weight, bias = conv_transpose_per_example_gradients(layer, activations[0], backprops)
    samples = weight.permute(0, 1, 4, 2, 3).reshape(len(weight), *layer.weight.shape)
    return {p: g for p, g in ((layer.weight, samples), (layer.bias, bias)) if p is not None and p.requires_grad}


# ----------------------------------------------------------------------------------------- PReLU
def prelu_grad_sample(layer: nn.PReLU, activations: list[torch.Tensor],
                      backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of ``nn.PReLU``, ``y = max(0, x) + a_c min(0, x)`` on channel ``c`` (dimension 1), or
    with one slope ``a`` for every entry: ``dL_i/da_c = sum min(0, x_i) g_i`` over the entries of channel ``c``
    (all entries, for one slope); PyTorch's kernel gives ``x = 0`` the slope's side, where the product is 0 too."""
    x = activations[0]
    products = x.clamp(max=0) * backprops
    return {layer.weight: products.reshape(len(x), layer.weight.numel(), -1).sum(2)}


# -------------------------------------------------------------------------------------- embeddings
def materialised_rows(rows: IndexedRows) -> torch.Tensor:
    """``(B, rows, Q)``: each example's gradient ``sum_r e_{index[i, r]} right[i, r]^T`` built densely."""
    batch, r, q = rows.right.shape
    keys = torch.arange(batch, device=rows.index.device).unsqueeze(1) * rows.rows + rows.index
    samples = torch.zeros(batch * rows.rows, q, dtype=rows.right.dtype, device=rows.right.device)
    return samples.index_add_(0, keys.reshape(-1), rows.right.reshape(batch * r, q)).view(batch, rows.rows, q)


def embedding_grad_sample(layer: nn.Embedding, activations: list[torch.Tensor],
                          backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of an ``nn.Embedding``: book-keeping's rows (no gradient for ``padding_idx``)."""
    rows = EmbeddingRule().gradients(layer, activations[0], backprops)
    return {p: materialised_rows(contribution) for p, contribution in rows.items()}


def embedding_bag_call(layer: nn.EmbeddingBag, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """The positional arguments ``(ids, offsets[, per_sample_weights])`` of the same call with 1-D ids.

    A 2-D input of B bags of L ids becomes, as ``F.embedding_bag`` turns it, its flattened ids with
    offsets ``0, L, ..., (B - 1) L`` (and ``B L`` under ``include_last_offset``).
    """
    bound = dict(zip(("input", "offsets", "per_sample_weights"), args), **kwargs)
    ids, offsets, weights = bound["input"], bound.get("offsets"), bound.get("per_sample_weights")
    if ids.dim() == 1 and offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")  # F.embedding_bag's own refusal
    if ids.dim() == 2:
        length = ids.shape[1]
        end = ids.numel() + (length if layer.include_last_offset else 0)
        offsets = torch.arange(0, end, length, dtype=ids.dtype, device=ids.device)
        ids = ids.reshape(-1)
        weights = None if weights is None else weights.reshape(-1)
    return (ids, offsets) if weights is None else (ids, offsets, weights)


def bag_count(layer: nn.EmbeddingBag, ids: torch.Tensor, offsets: torch.Tensor, *_: torch.Tensor) -> int:
    """The number of bags (examples) of a call in the form of :func:`embedding_bag_call`."""
    return len(offsets) - int(layer.include_last_offset)


def embedding_bag_rows(layer: nn.EmbeddingBag, activations: list[torch.Tensor],
                       backprops: torch.Tensor) -> IndexedRows:
    """Each bag's weight gradient as token-id rows ``sum_r e_{id_r} (c_r * g)^T`` (``g``: the bag's output gradient).

    ``activations``: a call in the form of :func:`embedding_bag_call`; the bags are padded to the
    longest (absent positions have ``c_r = 0``).  ``c_r`` is the id's per-sample weight (1 without)
    in mode "sum", ``1 / n`` in mode "mean" (n: the bag's ids other than ``padding_idx``), and, in mode
    "max", 1 in the dimensions where the id's row holds the bag's maximum (the first such position,
    as PyTorch's kernels choose it), 0 in the others; ids equal to ``padding_idx`` get 0.
    """
    ids, offsets, *weights = activations
    bags = bag_count(layer, ids, offsets)
    ends = offsets[1:] if layer.include_last_offset else torch.cat([offsets[1:], offsets.new_tensor([len(ids)])])
    lengths = ends - offsets[:bags]
    bag = torch.repeat_interleave(torch.arange(bags, device=ids.device), lengths)
    position = torch.arange(len(bag), device=ids.device) - offsets[bag]
    longest = max(int(lengths.max()) if bags else 0, 1)  # one position at least: argmax needs one
    index = ids.new_zeros(bags, longest)
    index[bag, position] = ids[:len(bag)]
    present = torch.zeros(bags, longest, dtype=torch.bool, device=ids.device)
    present[bag, position] = True
    if layer.padding_idx is not None:
        present &= index != layer.padding_idx
    if layer.mode == "max":
        rows = layer.weight.detach()[index].masked_fill(~present.unsqueeze(2), float("-inf"))
        positions = torch.arange(longest, device=ids.device).view(1, -1, 1)
        first_maximum = (positions == rows.argmax(1, keepdim=True)) & present.any(1).view(-1, 1, 1)
        return IndexedRows(index, first_maximum.to(backprops.dtype) * backprops.unsqueeze(1), layer.num_embeddings)
    coefficients = present.to(backprops.dtype)
    if weights:
        coefficients[bag, position] *= weights[0][:len(bag)].to(backprops.dtype)
    if layer.mode == "mean":
        coefficients = coefficients / present.sum(1, keepdim=True).clamp(min=1)
    return IndexedRows(index, coefficients.unsqueeze(2) * backprops.unsqueeze(1), layer.num_embeddings)


def embedding_bag_grad_sample(layer: nn.EmbeddingBag, activations: list[torch.Tensor],
                              backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example (per-bag) gradients of an ``nn.EmbeddingBag``: :func:`embedding_bag_rows`, materialised."""
    if not layer.weight.requires_grad:
        return {}
    return {layer.weight: materialised_rows(embedding_bag_rows(layer, activations, backprops))}


#: Opacus's grad samplers, with the layer types above computed here (a live view of Opacus's registry)
GRAD_SAMPLERS = ChainMap(
    {nn.Conv1d: conv_grad_sample, nn.Conv2d: conv_grad_sample, nn.Conv3d: conv_grad_sample,
     nn.ConvTranspose1d: conv_transpose_grad_sample, nn.ConvTranspose2d: conv_transpose_grad_sample,
     nn.PReLU: prelu_grad_sample, nn.Embedding: embedding_grad_sample, nn.EmbeddingBag: embedding_bag_grad_sample},
    GradSampleModule.GRAD_SAMPLERS,
)


class ExactGradSampleModule(GradSampleModule):
    """Opacus's ``GradSampleModule`` with :data:`GRAD_SAMPLERS`, and each ``nn.EmbeddingBag`` call's batch
    size read as its number of bags (Opacus reads the length of the call's last argument, which is
    the per-sample weights', or counts the last offset under ``include_last_offset``)."""

    GRAD_SAMPLERS = GRAD_SAMPLERS

    def rearrange_grad_samples(self, *, module: nn.Module, **options) -> tuple[torch.Tensor, torch.Tensor]:
        if type(module) is nn.EmbeddingBag and not hasattr(module, "max_batch_len"):
            module.max_batch_len = max(bag_count(module, *inputs) for inputs in module.activations)
        return super().rearrange_grad_samples(module=module, **options)


def extra_arguments(layer: nn.Module, args: tuple, kwargs: dict, constant_keywords: bool = False) -> Optional[str]:
    """What a call of a trainable layer passes beyond what its per-example gradients read (None: nothing).

    Grad samplers and functorch read a layer's first positional input only (``nn.EmbeddingBag``:
    also its offsets and per-sample weights); anything else would be left out of them.  A layer that
    book-keeping re-runs per example (``constant_keywords``) gets its keywords again, as long as they
    hold no tensor (a tensor could hold one row per example, which the re-run would not split).  A
    transposed convolution's ``output_size`` keyword only sets how many output positions it appends,
    which its per-example gradients read off the output gradient
    (:func:`conv_transpose_per_example_gradients`).
    """
    if type(layer) is nn.EmbeddingBag:
        return None
    if isinstance(layer, nn.modules.conv._ConvTransposeNd):
        kwargs = {key: value for key, value in kwargs.items() if key != "output_size"}
    if constant_keywords:
        kwargs = {key: value for key, value in kwargs.items()
                  if any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value))}
    if kwargs:
        return f"keyword arguments ({', '.join(kwargs)})"
    return f"{len(args)} positional arguments" if len(args) > 1 else None
