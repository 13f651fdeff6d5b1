"""Per-example clipping without materialising per-example gradients of dense layers.

For a dense layer applied once to each example (input ``a_i`` of shape ``(d_in,)``, gradient
of the loss w.r.t. its output ``g_i``), example ``i``'s weight gradient is the outer product
``g_i a_i^T``, and an outer product's entry-wise L1 and L2 norms factorise:

    ||g a^T||_p = ||g||_p * ||a||_p          (p = 1, 2)

(the L2 case is the "ghost norm" of Goodfellow 2015 / Li et al. 2022, the L1 case follows from
sum_jk |g_j a_k| = sum_j |g_j| * sum_k |a_k|).  The clipped sum over the batch is one matrix
product, ``(f * G)^T A`` with ``f`` the clip factors ("book-keeping", Bu et al. 2023, ICML,
"Differentially private optimization on large model at small cost"): one backward pass, and no
``(batch, d_out, d_in)`` tensor.  Convolutions (``Conv2d``, groups 1, zero padding) get exact
per-example gradients from one batched matmul over a channels-last sliding-window view
(:func:`conv2d_per_example_gradients`); every other trainable layer (normalisation, embeddings,
dense layers on sequences, other convolutions) from Opacus's registered grad samplers, as
:class:`opacus.GradSampleModule` would compute them.

The result is the same clipped sum as Opacus's hooks give (up to float rounding; tests compare
both against one-example-at-a-time autograd).  On the tutorial CNN, where 63% of the per-example
gradient entries sit in one dense layer, a DP step takes about 0.68x the time it takes with
Opacus's hooks (``benchmarks/bench_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from opacus import GradSampleModule
from opacus.utils.module_utils import trainable_modules
from torch import nn
from torch.nn import functional as F

from dpnoise.training.errors import InvalidTrainingOptionError, UnsupportedLayerError

#: conv2d_per_example_gradients gives weights as (out, kh, kw, in); this permutes them to (out, in, kh, kw)
CONV_WEIGHT_PERMUTATION = (0, 3, 1, 2)


def factorised_norms(activations: torch.Tensor, backprops: torch.Tensor, norm_ord: int,
                     with_bias: bool) -> torch.Tensor:
    """Per-example ``||g_i a_i^T||_p`` (plus the bias gradient ``g_i``): ``||g||_p ||a||_p``.

    Args:
        activations: ``(batch, d_in)`` layer inputs.
        backprops: ``(batch, d_out)`` loss gradients w.r.t. the layer outputs.
        norm_ord: 1 or 2.
        with_bias: include the bias gradient ``g_i`` in the norm.

    Returns:
        ``(batch,)`` norms over the layer's parameters (L2: the square root of the summed squares).
    """
    if norm_ord not in (1, 2):
        raise InvalidTrainingOptionError(f"norm_ord must be 1 or 2, got {norm_ord}")
    out_norms = backprops.norm(norm_ord, dim=1)
    weight_norms = out_norms * activations.norm(norm_ord, dim=1)
    if not with_bias:
        return weight_norms
    return torch.stack([weight_norms, out_norms], dim=1).norm(norm_ord, dim=1)


def factorised_clipped_sum(activations: torch.Tensor, backprops: torch.Tensor,
                           factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_i f_i g_i a_i^T, sum_i f_i g_i)``: the clipped weight and bias sums of a dense layer."""
    scaled = backprops * factors.to(backprops.dtype).unsqueeze(1)
    return scaled.t() @ activations, scaled.sum(dim=0)


def conv2d_per_example_gradients(layer: nn.Conv2d, activations: torch.Tensor,
                                 backprops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example (weight, bias) gradients of a ``Conv2d`` with groups 1 and zero padding.

    Weight: ``G_i[o, u, v, c] = sum_{h,w} g_i[o, h, w] x_i[c, s_h h + d_h u, s_w w + d_w v]`` on the
    zero-padded input ``x_i``, returned as ``(batch, out, kh, kw, in)`` (see
    :data:`CONV_WEIGHT_PERMUTATION`); bias: ``sum_{h,w} g_i[o, h, w]``, ``(batch, out)``.  One batched
    matmul over a channels-last sliding-window view: the windows are copied once, contiguous along
    channels, and the result needs no transpose (Opacus's ``unfold2d`` + einsum copies both).
    """
    n, out_channels, out_h, out_w = backprops.shape
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    padded = F.pad(activations, (pw, pw, ph, ph)).permute(0, 2, 3, 1).contiguous()
    stride_n, stride_h, stride_w, stride_c = padded.stride()
    windows = padded.as_strided(
        (n, out_h, out_w, kh, kw, layer.in_channels),
        (stride_n, stride_h * sh, stride_w * sw, stride_h * dh, stride_w * dw, stride_c),
    )
    weight = torch.bmm(backprops.reshape(n, out_channels, out_h * out_w), windows.reshape(n, out_h * out_w, -1))
    return weight.view(n, out_channels, kh, kw, layer.in_channels), backprops.sum(dim=(2, 3))


def has_channels_last_conv_gradients(layer: nn.Module) -> bool:
    """True for the convolutions :func:`conv2d_per_example_gradients` handles."""
    return (type(layer) is nn.Conv2d and layer.groups == 1 and layer.padding_mode == "zeros"
            and not isinstance(layer.padding, str))


@dataclass
class LayerRecord:
    """What one trainable layer saw in one backward pass."""

    #: (activations, backprops) of a dense layer on 2-D inputs (factorised), else None
    dense: Optional[tuple[torch.Tensor, torch.Tensor]]
    #: exact per-example gradients of the layer's trainable parameters (materialised layers)
    grad_samples: dict[nn.Parameter, torch.Tensor]
    #: axis order of a summed gradient -> the parameter's, where grad_samples stores another order
    permutations: dict[nn.Parameter, tuple[int, ...]] = field(default_factory=dict)


#: Layer types book-keeping handles (exact types): batch-first, one tensor in and out, and an Opacus
#: grad sampler for those not computed here.  Others (e.g. Opacus's RNN layers, whose batch is not
#: on dimension 0) are left to ``GradSampleModule``.
BOOKKEEPING_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.GroupNorm, nn.LayerNorm, nn.Embedding)


def unsupported_bookkeeping_layers(module: nn.Module) -> list[str]:
    """Trainable layers book-keeping does not handle (empty: the model is supported)."""
    return [
        f"{name or '<model>'} ({type(layer).__name__})"
        for name, layer in trainable_modules(module)
        if type(layer) not in BOOKKEEPING_LAYERS or type(layer) not in GradSampleModule.GRAD_SAMPLERS
    ]


class BookkeepingModule(nn.Module):
    """Wraps a model; records, per backward pass, what per-example clipping needs.

    A forward hook on every trainable layer keeps the layer's input and hooks the gradient of that
    call's output (so each input is paired with its own output gradient).  Only training-mode
    forward passes with autograd on are recorded.  ``loss_reduction="mean"``: the loss is the
    batch mean (as with ``GradSampleModule``), so output gradients are multiplied by the batch
    size.  Each trainable layer must run once per forward pass (no weight sharing), and each step
    must have exactly one backward pass (Poisson batches are never accumulated); anything else
    raises instead of mis-clipping.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        unsupported = unsupported_bookkeeping_layers(module)
        if unsupported:
            raise UnsupportedLayerError("book-keeping clipping does not support: " + ", ".join(unsupported))
        self._module = module
        self._layers = [layer for _, layer in trainable_modules(module)]
        self._records: dict[nn.Module, list[LayerRecord]] = {layer: [] for layer in self._layers}
        self._hooks = [layer.register_forward_hook(self._watch_output) for layer in self._layers]

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def _watch_output(self, layer: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        """In training with autograd on, record this call's input and, later, its output gradient."""
        if layer.training and torch.is_grad_enabled() and output.requires_grad:
            activations = inputs[0].detach()
            output.register_hook(lambda grad: self._record(layer, activations, grad.detach()))

    def _record(self, layer: nn.Module, activations: torch.Tensor, output_grad: torch.Tensor) -> None:
        backprops = output_grad * len(activations)  # undo the batch mean
        if type(layer) is nn.Linear and activations.dim() == 2 and layer.weight.requires_grad:
            record = LayerRecord(dense=(activations, backprops), grad_samples={})
        elif not len(activations):  # an empty Poisson batch: no per-example gradients
            record = LayerRecord(dense=None, grad_samples={})
        elif has_channels_last_conv_gradients(layer):
            weight, bias = conv2d_per_example_gradients(layer, activations, backprops)
            samples = {layer.weight: weight, layer.bias: bias}
            record = LayerRecord(dense=None, grad_samples=_trainable(samples),
                                 permutations={layer.weight: CONV_WEIGHT_PERMUTATION})
        else:
            sampler = GradSampleModule.GRAD_SAMPLERS[type(layer)]
            # Opacus's conv sampler (unfold2d, 1.6) reads inputs as if contiguous: channels-last
            # activations would give wrong per-example gradients.
            record = LayerRecord(dense=None, grad_samples=_trainable(sampler(layer, [activations.contiguous()], backprops)))
        self._records[layer].append(record)

    def _single_records(self) -> list[tuple[nn.Module, LayerRecord]]:
        """One record per layer, or a clear error (no backward yet / accumulated backward passes)."""
        counts = {len(records) for records in self._records.values()}
        if counts != {1}:
            raise RuntimeError(
                "per-example clipping needs exactly one forward and backward pass per optimizer step, "
                f"each trainable layer used once (recorded passes per layer: {sorted(counts)}); gradient "
                "accumulation over Poisson batches and weight sharing are not supported"
            )
        return [(layer, records[0]) for layer, records in self._records.items()]

    def per_example_norms(self, norm_ord: int) -> torch.Tensor:
        """``(batch,)`` L1 or L2 norm of each example's gradient over all trainable parameters."""
        per_layer = []
        for layer, record in self._single_records():
            if record.dense is not None:
                per_layer.append(factorised_norms(*record.dense, norm_ord, with_bias=_trains_bias(layer)))
            else:
                per_layer.extend(g.reshape(len(g), -1).norm(norm_ord, dim=1) for g in record.grad_samples.values())
        if not per_layer:  # an empty Poisson batch through materialised layers only
            return torch.zeros(0, device=next(self._module.parameters()).device)
        return torch.stack(per_layer, dim=1).norm(norm_ord, dim=1)

    def clipped_sums(self, params: list[nn.Parameter], factors: torch.Tensor) -> list[torch.Tensor]:
        """``sum_i factors[i] * grad_i`` for each of ``params``; consumes this step's records."""
        sums: dict[nn.Parameter, torch.Tensor] = {}
        for layer, record in self._single_records():
            if record.dense is not None:
                weight_sum, bias_sum = factorised_clipped_sum(*record.dense, factors)
                sums[layer.weight] = weight_sum
                if _trains_bias(layer):
                    sums[layer.bias] = bias_sum
            else:
                for p, g in record.grad_samples.items():
                    summed = torch.einsum("i,i...->...", factors.to(g.dtype), g)
                    sums[p] = summed.permute(record.permutations[p]).contiguous() if p in record.permutations else summed
        self.clear()
        missing = [tuple(p.shape) for p in params if p not in sums and len(factors)]
        if missing:
            raise RuntimeError(f"no per-example gradients for parameters of shapes {missing}; are they used in forward?")
        return [sums[p] if p in sums else torch.zeros_like(p) for p in params]

    def clear(self) -> None:
        """Forget recorded backward passes (called at ``zero_grad``)."""
        for records in self._records.values():
            records.clear()

    def remove_hooks(self) -> None:
        """Detach from the wrapped model (which then trains without recording anything)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self.clear()


def _trainable(samples: dict) -> dict[nn.Parameter, torch.Tensor]:
    """The entries of ``samples`` whose parameter exists and is trained."""
    return {p: g for p, g in samples.items() if p is not None and p.requires_grad}


def _trains_bias(layer: nn.Linear) -> bool:
    return layer.bias is not None and layer.bias.requires_grad
