"""``fix_model``: a model's layers that no per-layer rule covers exactly, swapped for dpnoise's equivalents."""

from __future__ import annotations

import warnings
from typing import Callable

from torch import nn

from dpnoise.layers.attention import MultiheadAttention
from dpnoise.layers.recurrent import GRU, LSTM, RNN

#: the layers :func:`fix_model` replaces by the same function built from linear maps (the original's weights)
EQUIVALENTS: dict[type, Callable[[nn.Module], nn.Module]] = {
    nn.MultiheadAttention: MultiheadAttention.from_module,
    nn.RNN: RNN.from_module,
    nn.LSTM: LSTM.from_module,
    nn.GRU: GRU.from_module,
}
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: the most groups a BatchNorm's replacement GroupNorm has (the largest divisor of the channels up to it)
MAX_GROUPS = 32


def group_norm_for(batch_norm: nn.modules.batchnorm._BatchNorm) -> nn.GroupNorm:
    """A GroupNorm over ``batch_norm``'s channels in the largest number of groups that divides them with at
    least two channels in each (a group of one channel has one value per example where there is no spatial
    dimension) and at most :data:`MAX_GROUPS`, with its affine scale and shift (another function: each
    example is normalised by its own statistics, not the batch's, which mix the examples)."""
    channels = batch_norm.num_features
    groups = max(g for g in range(1, max(1, min(MAX_GROUPS, channels // 2)) + 1) if channels % g == 0)
    weight = batch_norm.weight if batch_norm.affine else None
    norm = nn.GroupNorm(groups, channels, eps=batch_norm.eps, affine=batch_norm.affine,
                        device=None if weight is None else weight.device, dtype=None if weight is None else weight.dtype)
    if batch_norm.affine:
        norm.load_state_dict({"weight": batch_norm.weight.detach(), "bias": batch_norm.bias.detach()})
        norm.requires_grad_(batch_norm.weight.requires_grad)
    return norm.train(batch_norm.training)


def fix_model(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.MultiheadAttention``, ``nn.RNN``, ``nn.LSTM`` and ``nn.GRU`` replaced in place by
    its :mod:`dpnoise.layers` equivalent (the same outputs, with the original's weights) and every BatchNorm by
    a GroupNorm (:func:`group_norm_for`: another function, warned), so that book-keeping covers each layer
    exactly.  A model that is one of these layers is returned replaced."""
    replaced = _replacement(model)
    if replaced is not None:
        return replaced
    for name, child in list(model.named_children()):
        setattr(model, name, fix_model(child))
    return model


def _replacement(layer: nn.Module) -> nn.Module | None:
    for kind, equivalent in EQUIVALENTS.items():
        if type(layer) is kind:
            return equivalent(layer)
    if isinstance(layer, BATCH_NORMS):
        warnings.warn(f"fix_model: {type(layer).__name__}({layer.num_features}) becomes a GroupNorm, another function "
                      "(batch statistics mix the examples, so they cannot be trained privately): retrain or fine-tune "
                      "the model with it", stacklevel=3)
        return group_norm_for(layer)
    return None
