"""Per-example gradients of one layer alone, by ``torch.func``: book-keeping's source for the trainable
layers that have neither a rule nor a grad sampler.

For a layer called on a batch ``x`` (examples on dimension 0) whose output received the gradient ``g``,
the gradient of example i's loss with respect to the layer's own parameters theta is

    d/dtheta <g_i, layer(x_i; theta)>,

the vector-Jacobian product of the layer on that example alone.  ``torch.func.vmap`` of
``torch.func.grad`` computes it for every example at once, re-running the layer's forward on its
recorded input, with its sub-layers' parameters held fixed (their own sources give theirs).  This is
exact for a layer that treats its examples independently, which the per-example check of the first
step verifies against one-example autograd; it replaces sending the whole model to Opacus's hooks
because one layer (an RMSNorm variant, a learned scale, a CLS token) has no rule.

A layer that draws random numbers in its forward pass (dropout with p > 0) is refused at the step:
the recomputed forward would draw another mask than the one the batch's gradient went through.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpnoise.training.errors import UnsupportedLayerError


def layer_per_example_gradients(layer: nn.Module, inputs: torch.Tensor, keywords: dict[str, Any],
                                output_grad: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """``{p: (B, *p.shape)}`` per-example gradients of ``layer``'s own trainable parameters, from its
    recorded call ``layer(inputs, **keywords)`` (``keywords``: constants, no tensors) and the gradient
    ``output_grad`` of its output (module docstring)."""
    own = {name: p for name, p in layer.named_parameters(recurse=False) if p.requires_grad}

    def example_product(parameters: dict[str, torch.Tensor], example: torch.Tensor,
                        example_grad: torch.Tensor) -> torch.Tensor:
        output = functional_call(layer, parameters, (example.unsqueeze(0),), keywords)
        if not isinstance(output, torch.Tensor):
            raise UnsupportedLayerError(
                f"{type(layer).__name__} returns {type(output).__name__}, not one tensor: book-keeping cannot compute "
                f"its per-example gradients; use grad_sample_mode='hooks'")
        return (output * example_grad.unsqueeze(0).to(output.dtype)).sum()

    per_example = vmap(grad(example_product), in_dims=(None, 0, 0), randomness="error")
    detached = {name: p.detach() for name, p in own.items()}
    try:
        with torch.no_grad():  # torch.func.grad differentiates anyway; no graph for the sub-layers' parameters
            gradients = per_example(detached, inputs, output_grad)
    except RuntimeError as err:
        if "randomness" not in str(err):
            raise
        raise UnsupportedLayerError(
            f"{type(layer).__name__} draws random numbers in its forward pass (e.g. dropout with p > 0): book-keeping "
            f"re-runs that layer to get its per-example gradients and would not draw the same; move the dropout into "
            f"a layer without trainable parameters, or use grad_sample_mode='hooks'") from err
    return {own[name]: gradient for name, gradient in gradients.items()}


__all__ = ["layer_per_example_gradients"]
