"""Model checks before private training: every layer must keep examples separate."""

from __future__ import annotations

from opacus.utils.module_utils import trainable_modules
from opacus.validators import ModuleValidator
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from dpnoise.training.errors import UnsupportedLayerError


def unsupported_layer_reasons(module: nn.Module, *, needs_per_sample_gradients: bool) -> list[str]:
    """One line per unsupported layer: ``"<path> (<type>): <why>"``; empty when the model is fine.

    Batch normalisation is always refused: its batch statistics make each example's output depend
    on the other examples in the batch, which no per-example mechanism accounts for.  For gradient
    mechanisms, trainable layers with buffers and layers Opacus's validators reject are refused too.
    """
    reasons = []
    for name, layer in module.named_modules():
        path = name or "<model>"
        if isinstance(layer, _BatchNorm):
            reasons.append(
                f"{path} ({type(layer).__name__}): batch statistics mix examples; use GroupNorm or LayerNorm"
            )
    if needs_per_sample_gradients:
        for name, layer in trainable_modules(module):
            if isinstance(layer, _BatchNorm):
                continue
            path = name or "<model>"
            if any(True for _ in layer.buffers(recurse=False)):
                reasons.append(f"{path} ({type(layer).__name__}): trainable layer with buffers")
            validator = ModuleValidator.VALIDATORS.get(type(layer))
            if validator is not None:
                reasons.extend(f"{path} ({type(layer).__name__}): {error}" for error in validator(layer))
    return reasons


def check_supported_layers(module: nn.Module, *, needs_per_sample_gradients: bool) -> None:
    """Raise :class:`UnsupportedLayerError` naming every unsupported layer of ``module``."""
    reasons = unsupported_layer_reasons(module, needs_per_sample_gradients=needs_per_sample_gradients)
    if reasons:
        raise UnsupportedLayerError("unsupported layers for private training:\n  " + "\n  ".join(reasons))
