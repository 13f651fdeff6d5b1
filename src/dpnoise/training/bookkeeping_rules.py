"""Book-keeping rules: how a trainable layer's call is computed and what per-example gradients it leaves.

A rule computes its layer's output without any parameter gradient (autograd then back-propagates
through the layer to its input only, and never computes the batch's summed weight gradient, which
DP training would discard) and turns the layer's input and output gradient into the per-example
gradients of its trainable parameters, kept factorised where possible
(:mod:`dpnoise.training.per_example_gradients`).  Rules are registered per layer type, in the idiom
of Opacus's ``register_grad_sampler``::

    @register_bookkeeping_rule(nn.Linear)
    class LinearRule(BookkeepingRule): ...

The layer types without a rule here are recorded as they run, their per-example gradients built
from their inputs and output gradients (:data:`dpnoise.training.bookkeeping.RECORDED_LAYERS`:
convolutions, transposed convolutions, normalisations, ``PReLU``, ``nn.EmbeddingBag``), read off a gradient
captured inside them (Hugging Face's ``ViTEmbeddings``: :mod:`dpnoise.training.captured_sources`), re-run alone
per example by ``torch.func``, or are not book-kept at all
(:func:`dpnoise.training.bookkeeping.unsupported_bookkeeping_layers`).

The elementwise layers of :mod:`dpnoise.layers` (``Scale``, ``Shift``, ``ClsToken``, ``PositionEmbedding``) have
rules here: a parameter used elementwise has, per example, the output gradient (times the input, for a scale)
summed over the positions it is repeated along, which a registered exact type makes sound to read off; the same
parameter held bare by a module of the user's own could be used in any way, and keeps the ``torch.func`` source.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.layers import ClsToken, PositionEmbedding, Scale, Shift
from dpnoise.training.per_example_gradients import (
    Contribution,
    DenseRows,
    IndexedRows,
    MaterialisedGradients,
    compute_dtype,
)
from dpnoise.training.sharding import layer_type


class BookkeepingRule:
    """How book-keeping computes one type of layer, called with one tensor (batch on dimension 0)."""

    #: whether the layer's ``weight`` comes as rows of outer products (``DenseRows`` / ``IndexedRows``),
    #: which uses of a weight shared between layers can add up only with other rows
    factorises_weight = False

    def problems(self, layer: nn.Module) -> list[str]:
        """Why this layer cannot be book-kept exactly (empty: it can)."""
        return []

    def applies(self, layer: nn.Module) -> bool:
        """Whether this rule computes ``layer`` (a rule registered by class name checks the layer's structure:
        where it does not apply, the layer takes another source)."""
        return True

    def forward(self, layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The layer's output (called with autograd off)."""
        raise NotImplementedError

    def input_gradient(self, layer: nn.Module, inputs: torch.Tensor, output_grad: torch.Tensor) -> Optional[torch.Tensor]:
        """The loss gradient w.r.t. ``inputs``, from the gradient w.r.t. the output."""
        raise NotImplementedError

    def gradients(self, layer: nn.Module, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        """Per-example gradients of the layer's trainable parameters (``output_grad``: w.r.t. the output)."""
        raise NotImplementedError


#: layer type (or the qualified name ``"package.module.Class"`` of a type not imported here) -> its rule
BOOKKEEPING_RULES: dict[Union[type, str], BookkeepingRule] = {}


def register_bookkeeping_rule(*layer_types: Union[type, str]) -> Callable[[type], type]:
    """Class decorator: an instance of the decorated :class:`BookkeepingRule` computes ``layer_types``
    (exact types; a string names a type by its qualified name, so that its package need not be imported)."""

    def register(rule_class: type) -> type:
        rule = rule_class()
        for registered_type in layer_types:
            BOOKKEEPING_RULES[registered_type] = rule
        return rule_class

    return register


def bookkeeping_rule(layer: nn.Module) -> Optional[BookkeepingRule]:
    """The rule registered for the layer's type (None: no rule); a layer given to ``fully_shard`` itself
    takes its own class's rule (:func:`~dpnoise.training.sharding.layer_type`)."""
    own_type = layer_type(layer)
    rule = BOOKKEEPING_RULES.get(own_type) or BOOKKEEPING_RULES.get(f"{own_type.__module__}.{own_type.__qualname__}")
    return rule if rule is not None and rule.applies(layer) else None


class OwnForwardRule(BookkeepingRule):
    """A rule whose output is the layer's own forward (its checks, casts and statistics included)."""

    def forward(self, layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return type(layer).forward(layer, inputs)


@register_bookkeeping_rule(nn.Linear)
class LinearRule(BookkeepingRule):
    """``y = x W^T + b`` on inputs ``(B, ..., d_in)``: weight rows ``u = g, v = a``; bias ``sum_t g_t``."""

    factorises_weight = True

    def forward(self, layer: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        return F.linear(inputs, layer.weight, layer.bias)

    def input_gradient(self, layer: nn.Linear, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        return output_grad @ layer.weight.to(output_grad.dtype)

    def gradients(self, layer: nn.Linear, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        activations, backprops = _rows(inputs, layer.in_features), _rows(output_grad, layer.out_features)
        return _trainable({layer.weight: DenseRows(backprops, activations), layer.bias: _summed_rows(backprops)})


@register_bookkeeping_rule("transformers.pytorch_utils.Conv1D")
class TransposedLinearRule(BookkeepingRule):
    """Hugging Face's ``Conv1D`` (GPT-2): ``y = x W + b`` with ``W`` of shape ``(d_in, d_out)``: weight
    rows ``u = a, v = g``; bias ``sum_t g_t``."""

    factorises_weight = True

    def forward(self, layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return F.linear(inputs, layer.weight.t(), layer.bias)

    def input_gradient(self, layer: nn.Module, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        return output_grad @ layer.weight.t().to(output_grad.dtype)

    def gradients(self, layer: nn.Module, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        activations, backprops = _rows(inputs, layer.nx), _rows(output_grad, layer.nf)
        return _trainable({layer.weight: DenseRows(activations, backprops), layer.bias: _summed_rows(backprops)})


@register_bookkeeping_rule(nn.Embedding)
class EmbeddingRule(BookkeepingRule):
    """Token ids ``(B, ...)``: one-hot weight rows ``e_{id_t}, v = g_t`` (``padding_idx`` gets none, as in
    PyTorch; ``max_norm`` and ``scale_grad_by_freq`` are refused for every gradient source:
    :func:`~dpnoise.training.grad_samplers.per_example_gradient_problems`)."""

    factorises_weight = True

    def forward(self, layer: nn.Embedding, inputs: torch.Tensor) -> torch.Tensor:
        return F.embedding(inputs, layer.weight, layer.padding_idx)

    def input_gradient(self, layer: nn.Embedding, inputs: torch.Tensor, output_grad: torch.Tensor) -> None:
        return None  # token ids have no gradient

    def gradients(self, layer: nn.Embedding, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        index = inputs.reshape(len(inputs), -1)
        backprops = _rows(output_grad, layer.embedding_dim)
        if layer.padding_idx is not None:
            backprops = backprops.masked_fill((index == layer.padding_idx).unsqueeze(2), 0)
        return _trainable({layer.weight: IndexedRows(index, backprops, layer.num_embeddings)})


@register_bookkeeping_rule(nn.LayerNorm)
class LayerNormRule(BookkeepingRule):
    """``y = x_hat * w + b`` over the last dimensions: per-example ``sum_t g_t * x_hat_t`` and ``sum_t g_t``."""

    def forward(self, layer: nn.LayerNorm, inputs: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(inputs, layer.normalized_shape, layer.weight, layer.bias, layer.eps)

    def input_gradient(self, layer: nn.LayerNorm, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        # Recomputing the (cheap) normalisation lets PyTorch's own kernel give the input gradient.
        with torch.enable_grad():
            detached = inputs.detach().requires_grad_(True)
            weight = None if layer.weight is None else layer.weight.detach()
            bias = None if layer.bias is None else layer.bias.detach()
            output = F.layer_norm(detached, layer.normalized_shape, weight, bias, layer.eps)
            return torch.autograd.grad(output, detached, output_grad)[0]

    def gradients(self, layer: nn.LayerNorm, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        shape = tuple(layer.normalized_shape)
        dtype = compute_dtype(output_grad.dtype)
        normalized = F.layer_norm(inputs.to(dtype), shape, eps=layer.eps).reshape(len(inputs), -1, *shape)
        backprops = output_grad.to(dtype).reshape(len(inputs), -1, *shape)
        return _trainable({layer.weight: MaterialisedGradients((backprops * normalized).sum(1)),
                           layer.bias: MaterialisedGradients(backprops.sum(1))})


@register_bookkeeping_rule("transformers.models.llama.modeling_llama.LlamaRMSNorm",
                           "transformers.models.t5.modeling_t5.T5LayerNorm",
                           "transformers.models.mistral.modeling_mistral.MistralRMSNorm",
                           "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm")
class ScaledRmsNormRule(OwnForwardRule):
    """Hugging Face's RMSNorm variants, ``y = w * x_hat`` with ``x_hat = x / sqrt(mean(x^2) + eps)`` over the last
    dimension (``eps``: ``variance_epsilon``): per-example ``sum_t g_t * x_hat_t``.  The output and the input
    gradient are the layer's own forward (its float32 statistics and casts included); the rule applies only
    where that forward computes this formula, checked on a random input (by structure, not by class name:
    a variant such as Gemma's ``(1 + w) * x_hat`` takes the per-layer source)."""

    def applies(self, layer: nn.Module) -> bool:
        weight, eps = getattr(layer, "weight", None), getattr(layer, "variance_epsilon", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or not isinstance(eps, float) \
                or [name for name, _ in layer.named_parameters()] != ["weight"]:
            return False
        probe = torch.randn(2, 3, weight.numel(), generator=torch.Generator().manual_seed(0)).to(weight)
        with torch.no_grad():
            expected = weight * _rms_normalized(probe, eps)
            return bool(torch.allclose(type(layer).forward(layer, probe), expected, rtol=1e-4, atol=1e-5))

    def input_gradient(self, layer: nn.Module, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            detached = inputs.detach().requires_grad_(True)
            return torch.autograd.grad(type(layer).forward(layer, detached), detached, output_grad)[0]

    def gradients(self, layer: nn.Module, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        dtype = compute_dtype(output_grad.dtype)
        width = layer.weight.numel()
        normalized = _rms_normalized(inputs.to(dtype), layer.variance_epsilon).reshape(len(inputs), -1, width)
        backprops = output_grad.to(dtype).reshape(len(inputs), -1, width)
        return _trainable({layer.weight: MaterialisedGradients((backprops * normalized).sum(1))})


@register_bookkeeping_rule(Scale)
class ScaleRule(OwnForwardRule):
    """``y = x * w``, ``w`` broadcast over each example's trailing dimensions: ``dL_i/dw`` is ``g_i * x_i`` summed
    over the positions ``w`` is repeated along; ``dL/dx = g * w``, summed where ``w`` broadcast ``x``."""

    def input_gradient(self, layer: Scale, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        return (output_grad * layer.weight.to(output_grad.dtype)).sum_to_size(inputs.shape)

    def gradients(self, layer: Scale, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        dtype = compute_dtype(output_grad.dtype)
        products = inputs.to(dtype) * output_grad.to(dtype)
        return _trainable({layer.weight: MaterialisedGradients(_per_example_sum(products, layer.weight.shape))})


@register_bookkeeping_rule(Shift)
class ShiftRule(OwnForwardRule):
    """``y = x + b``, ``b`` broadcast over each example's trailing dimensions: ``dL_i/db`` is ``g_i`` summed over
    the positions ``b`` is repeated along; ``dL/dx = g``, summed where ``b`` broadcast ``x``."""

    def input_gradient(self, layer: Shift, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        return output_grad.sum_to_size(inputs.shape)

    def gradients(self, layer: Shift, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        backprops = output_grad.to(compute_dtype(output_grad.dtype))
        return _trainable({layer.bias: MaterialisedGradients(_per_example_sum(backprops, layer.bias.shape))})


@register_bookkeeping_rule(PositionEmbedding)
class PositionEmbeddingRule(OwnForwardRule):
    """``y[..., t, :] = x[..., t, :] + W[t]`` for ``t < T``: ``dL_i/dW[t] = sum_{...} g_i[..., t, :]`` (zero for the
    rows ``t >= T`` that a shorter sequence does not use); ``dL/dx = g``."""

    def input_gradient(self, layer: PositionEmbedding, inputs: torch.Tensor,
                       output_grad: torch.Tensor) -> torch.Tensor:
        return output_grad

    def gradients(self, layer: PositionEmbedding, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        length, unused = inputs.shape[-2], layer.weight.shape[0] - inputs.shape[-2]
        used = _per_example_sum(output_grad.to(compute_dtype(output_grad.dtype)), (length, layer.weight.shape[1]))
        return _trainable({layer.weight: MaterialisedGradients(F.pad(used, (0, 0, 0, unused)))})


@register_bookkeeping_rule(ClsToken)
class ClsTokenRule(OwnForwardRule):
    """``y = [c; x]`` along the tokens: ``dL_i/dc = g_i[0]``, ``dL/dx = g[:, 1:]``."""

    def input_gradient(self, layer: ClsToken, inputs: torch.Tensor, output_grad: torch.Tensor) -> torch.Tensor:
        return output_grad[:, 1:]

    def gradients(self, layer: ClsToken, inputs: torch.Tensor,
                  output_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        return _trainable({layer.token: MaterialisedGradients(output_grad[:, 0].to(compute_dtype(output_grad.dtype)))})


def _per_example_sum(values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``(B, *shape)``: ``values`` ``(B, ...)`` summed over the dimensions along which a tensor of ``shape``,
    broadcast against each example's trailing dimensions, is repeated (the per-example gradient of a parameter
    of ``shape`` used elementwise, from the products it multiplies)."""
    leading = (1,) * (values.dim() - 1 - len(shape))
    return values.sum_to_size(len(values), *leading, *shape).reshape(len(values), *shape)


def _rms_normalized(values: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over the last dimension, the statistics in at least float32."""
    wide = values.to(torch.promote_types(values.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(values.dtype)


def _rows(values: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, ..., width)`` as ``(B, R, width)``: every position of an example is a row."""
    return values.reshape(len(values), -1, width)


def _summed_rows(rows: torch.Tensor) -> MaterialisedGradients:
    """A bias's per-example gradients ``sum_r rows[i, r]``, in the compute dtype."""
    return MaterialisedGradients(rows.sum(1, dtype=compute_dtype(rows.dtype)))


def _trainable(contributions: dict) -> dict[nn.Parameter, Contribution]:
    """The entries of ``contributions`` whose parameter exists and is trained."""
    return {p: c for p, c in contributions.items() if p is not None and p.requires_grad}
