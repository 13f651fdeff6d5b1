"""How the engine wraps a model for per-example gradients: book-keeping, or Opacus's hooks.

One place for what ``make_private`` does to a model of a gradient mechanism, so that whatever
checks the per-example gradients of a model (:func:`dpnoise.training.check_per_example`) checks
the ones training will use.
"""

from __future__ import annotations

from opacus import GradSampleModule
from torch import nn

from dpnoise.training.bookkeeping import BookkeepingModule, broadcast_inputs_over_batch, unsupported_bookkeeping_layers
from dpnoise.training.execution import GradSampleMode, check_grad_sample_mode


def make_conv_inputs_contiguous(module: nn.Module) -> None:
    """Make every Conv2d of ``module`` see contiguous inputs (no copy when they already are).

    Opacus 1.6's conv grad sampler (``unfold2d``) reads its input as if contiguous, so a
    channels-last model would get wrong per-example gradients under ``GradSampleModule``.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            layer.register_forward_pre_hook(lambda _layer, args: (args[0].contiguous(), *args[1:]))


def resolve_grad_sample_mode(module: nn.Module, grad_sample_mode: GradSampleMode) -> GradSampleMode:
    """``"bookkeeping"`` or ``"hooks"``: ``"auto"`` is book-keeping when every trainable layer of
    ``module`` supports it, else hooks."""
    check_grad_sample_mode(grad_sample_mode)
    if grad_sample_mode != "auto":
        return grad_sample_mode
    return "hooks" if unsupported_bookkeeping_layers(module) else "bookkeeping"


def wrap_for_per_example_gradients(module: nn.Module,
                                   grad_sample_mode: GradSampleMode) -> tuple[nn.Module, GradSampleMode]:
    """The private module that computes ``module``'s per-example gradients, and its mode (``"auto"``
    resolved): a :class:`BookkeepingModule`, or Opacus's ``GradSampleModule`` for the batch-mean loss
    (gradient accumulation forbidden) with contiguous conv inputs and batch-size-1 layer inputs
    broadcast over the batch.  Hooks are added to ``module`` itself."""
    grad_sample_mode = resolve_grad_sample_mode(module, grad_sample_mode)
    if grad_sample_mode == "bookkeeping":
        return BookkeepingModule(module), grad_sample_mode
    make_conv_inputs_contiguous(module)
    broadcast_inputs_over_batch(module)
    private_module = GradSampleModule(module, loss_reduction="mean")
    private_module.forbid_grad_accumulation()
    return private_module, grad_sample_mode
