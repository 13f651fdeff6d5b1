"""Penultimate-layer Gaussian baseline (Monir & Ghinita 2024; docs/theory/dirichlet.md §6).

RECONSTRUCTION (the paper's exact sensitivity and accountant were not recovered): in training mode
the input of the classifier's output layer (the penultimate activations h(x)) is clipped per
example to L2 norm C and receives N(0, sigma^2 C^2) noise per example and coordinate.

Accounting: labels are public and an example's input may be REPLACED, so the clipped activations of
one example move by at most 2C; the release is a Gaussian mechanism with L2 sensitivity 2C and noise
std sigma C, i.e. a Gaussian with noise multiplier sigma / 2, Poisson-subsampled (the
``penultimate-gaussian`` accountant of :mod:`dpnoise.accounting` takes sigma and does the halving).  This is a conservative reading; like the Dirichlet mechanism it covers the
released noisy activations, not the trained parameters (docs/theory/dirichlet.md §5).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from dpnoise.accounting.events import GaussianEvent
from dpnoise.accounting.validation import check_positive
from dpnoise.mechanisms.registry import implement_mechanism
from dpnoise.prepared import PreparedForAccelerate
from dpnoise.mechanisms.clipping import clip_factors
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.noise import gaussian_noise


def output_layer(module: nn.Module) -> tuple[str, nn.Linear]:
    """The last ``nn.Linear`` registered in ``module`` (taken as the classifier's output layer)."""
    linears = [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InvalidMechanismError(
            f"penultimate-gaussian needs an nn.Linear output layer; {type(module).__name__} has none"
        )
    return linears[-1]


def clip_and_noise_rows(
    activations: torch.Tensor, sigma: float, clip: float, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """Clip each row (example) to L2 norm ``clip`` and add N(0, (sigma clip)^2) noise
    (:func:`~dpnoise.mechanisms.noise.gaussian_noise`: drawn in float64 on the activations' device)."""
    flat = activations.reshape(len(activations), -1)
    clipped = flat * clip_factors(flat.norm(2, dim=1), clip).unsqueeze(1)
    return (clipped + gaussian_noise(clipped, sigma, clip, generator)).reshape(activations.shape)


class PenultimateGaussian(nn.Module):
    """Wraps a classifier: in training mode its output layer sees clipped, noised activations."""

    #: accelerate's prepare() leaves the private module unwrapped (:mod:`dpnoise.prepared`)
    _is_accelerate_prepared = PreparedForAccelerate()

    def __init__(self, module: nn.Module, sigma: float, clip: float, generator: Optional[torch.Generator] = None):
        super().__init__()
        check_positive("sigma", sigma)
        check_positive("clip", clip)
        self.module = module
        self.sigma = sigma
        self.clip = clip
        self.generator = generator
        self.layer_name, layer = output_layer(module)
        self._hook = layer.register_forward_pre_hook(self._sanitize_input)

    def _sanitize_input(self, layer: nn.Module, inputs: tuple) -> Optional[tuple]:
        if not self.training:
            return None
        (activations, *rest) = inputs
        return (clip_and_noise_rows(activations, self.sigma, self.clip, self.generator), *rest)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.module(*args, **kwargs)


def wrap_penultimate(module: nn.Module, event: GaussianEvent, *, clip: float, generator) -> nn.Module:
    """The penultimate-layer Gaussian's torch side: clipped, noised activations in training mode.  The event's
    noise multiplier is relative to the sensitivity 2C (a replaced input moves a clipped activation by up to
    2C), so the noise std is 2 C times it, sigma C."""
    return PenultimateGaussian(module, sigma=2.0 * event.noise_multiplier, clip=clip, generator=generator)


implement_mechanism("penultimate-gaussian", wrap_module=wrap_penultimate)
