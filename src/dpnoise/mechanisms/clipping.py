"""Per-example gradient clipping (L2 or exact L1) on per-sample gradients.

The per-sample gradients come from Opacus (``p.grad_sample``: one tensor per parameter, with the
batch on dimension 0).  Clipping never materialises the clipped per-sample gradients: it computes
one factor per example, ``min(1, C / ||g_i||)``, and :func:`clipped_sum` folds the factors into
the sum over the batch.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from dpnoise.accounting.validation import InvalidParameterError

#: Added to the norm before dividing, as in Opacus, so that a zero gradient gets factor 1.
NORM_EPSILON = 1e-6


def per_example_norms(grad_samples: Sequence[torch.Tensor], norm_ord: int) -> torch.Tensor:
    """Norm of each example's full gradient (all parameters together).

    Args:
        grad_samples: per-parameter per-sample gradients, each of shape ``(batch, *param_shape)``.
        norm_ord: 2 for the Euclidean norm, 1 for the L1 norm.

    Returns:
        Tensor of shape ``(batch,)``.
    """
    if norm_ord not in (1, 2):
        raise InvalidParameterError(f"norm_ord must be 1 or 2, got {norm_ord}")
    per_param = torch.stack(
        [g.reshape(len(g), -1).norm(norm_ord, dim=1) for g in grad_samples], dim=1
    )
    return per_param.norm(norm_ord, dim=1)


def clip_factors(norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Per-example scale factors ``min(1, C / (norm + 1e-6))``; scaled norms are <= C."""
    return (max_norm / (norms + NORM_EPSILON)).clamp(max=1.0)


def automatic_clip_factors(norms: torch.Tensor, max_norm: float, gamma: float) -> torch.Tensor:
    """Automatic clipping's factors ``C / (norm + gamma)`` (Bu et al., "Automatic Clipping: Differentially
    Private Deep Learning Made Easier and Stronger", arXiv 2206.07136, AUTO-S): every example's gradient is
    normalised, none left unscaled; the scaled norms C norm / (norm + gamma) are < C, so the sensitivity,
    and every accountant, is the clipped one's."""
    return max_norm / (norms + gamma)


#: (per-example norms) -> per-example scale factors, whose scaled norms are at most the clipping norm
ClippingRule = Callable[[torch.Tensor], torch.Tensor]
def clipping_rule(name: str, max_norm: float, gamma: Optional[float] = None) -> ClippingRule:
    """The per-example scale factors of the clipping rule ``name`` at norm C: "flat" (min(1, C / norm)) or
    "automatic" (C / (norm + gamma), :func:`automatic_clip_factors`)."""
    if name == "flat":
        return lambda norms: clip_factors(norms, max_norm)
    if name == "automatic":
        if gamma is None or not gamma > 0:
            raise InvalidParameterError(f"automatic clipping needs a gamma > 0, got {gamma!r}")
        return lambda norms: automatic_clip_factors(norms, max_norm, gamma)
    raise InvalidParameterError(f"clipping must be 'flat' or 'automatic', got {name!r}")


def clipped_sum(grad_sample: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of ``factors[i] * grad_sample[i]`` (one parameter)."""
    return torch.einsum("i,i...->...", factors.to(grad_sample.dtype), grad_sample)
