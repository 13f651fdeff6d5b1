"""Per-example gradient clipping (L2 or exact L1) on per-sample gradients.

The per-sample gradients come from Opacus (``p.grad_sample``: one tensor per parameter, with the
batch on dimension 0).  Clipping never materialises the clipped per-sample gradients: it computes
one factor per example, ``min(1, C / ||g_i||)``, and :func:`clipped_sum` folds the factors into
the sum over the batch.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from dpnoise.accounting.validation import InvalidParameterError, check_positive
from dpnoise.mechanisms.registry import NOISE_SAMPLERS

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


def updated_clip(clip: float, noisy_fraction: float, target_quantile: float, learning_rate: float) -> float:
    """Adaptive clipping's geometric update C exp(-eta_C (b - gamma)) (Andrew et al., "Differentially Private
    Learning with Adaptive Clipping", arXiv 1905.03871, Algorithm 1): b, the noisy fraction of the batch with
    norm <= C, above the target quantile gamma shrinks C, below it grows C, so that C moves toward the
    gamma-quantile of the norms."""
    return clip * math.exp(-learning_rate * (noisy_fraction - target_quantile))


class AdaptiveClipping:
    """Flat clipping to a threshold C_t that follows a quantile of the per-example gradient norms (Andrew et
    al., arXiv 1905.03871), as a :data:`ClippingRule` of a step's noisy sum.

    The released gradient must carry noise scaled with C_t (std sigma C_t; Laplace scale b C_t / C_0) while the
    accountants see the step calibrated at C_0 (``initial_clip``).  So each example's gradient is clipped to C_t
    and scaled by C_0 / C_t: its contribution is at most C_0, the sum is released exactly as at C_0 (the
    mechanism's noise, its sensitivity C_0), and :meth:`release` multiplies the released sums by C_t / C_0 (post-
    processing): the gradient is the sum clipped to C_t plus the noise at C_t.  With it, every step releases the
    count of the batch's examples with norm <= C_t plus ``count_noise`` (law ``count_noise_law``: Gaussian std or
    Laplace scale; the count's sensitivity is 1) from the run's noise ``generator``, and C_{t+1} follows
    :func:`updated_clip` with b_t = noisy count / ``expected_batch_size``.
    """

    def __init__(self, *, initial_clip: float, target_quantile: float, learning_rate: float, count_noise: float,
                 count_noise_law: str, expected_batch_size: float, generator: Optional[torch.Generator]):
        self.initial_clip = check_positive("max_grad_norm", initial_clip)
        self.target_quantile = target_quantile
        self.learning_rate = learning_rate
        self.count_noise = check_positive("quantile_noise", count_noise)
        self.sample_count_noise = NOISE_SAMPLERS[count_noise_law]
        self.expected_batch_size = check_positive("expected_batch_size", expected_batch_size)
        self.generator = generator
        #: C_t, the threshold of the current step (a checkpoint saves it)
        self.clip = self.initial_clip
        #: the current step's examples with norm <= C_t so far (None: none seen yet)
        self.count: Optional[torch.Tensor] = None

    def __call__(self, norms: torch.Tensor) -> torch.Tensor:
        """The scale factors of one physical batch, min(1, C_t / norm) C_0 / C_t; its examples with norm <= C_t
        are added to the step's count."""
        below = (norms <= self.clip).sum(dtype=torch.float64)
        self.count = below if self.count is None else self.count + below
        return clip_factors(norms, self.clip) * (self.initial_clip / self.clip)

    def release(self, released: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The step's released sums (noised at C_0) rescaled to C_t; then C_t moves by the noisy count, and the
        next step's count starts at 0."""
        scale = self.clip / self.initial_clip
        rescaled = [value * scale for value in released]
        count = self.count if self.count is not None else torch.zeros((), dtype=torch.float64,
                                                                      device=released[0].device)
        noisy = count + self.sample_count_noise(count, self.count_noise, 1.0, self.generator, 1)
        self.clip = updated_clip(self.clip, float(noisy) / self.expected_batch_size, self.target_quantile,
                                 self.learning_rate)
        self.count = None
        return rescaled

    def discard(self) -> None:
        """Forget the step's count (a refused step releases nothing)."""
        self.count = None
