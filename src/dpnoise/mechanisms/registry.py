"""Registry of training mechanisms: what each one clips, what noise it adds, how it is accounted.

A mechanism either privatises the SUM of clipped per-example gradients (``releases="gradients"``:
per-sample gradients are needed) or privatises each example's model output
(``releases="outputs"``: a plain module wrapped by ``wrap_module``, no per-sample gradients).
What an output mechanism's epsilon covers is stated by its accountant's ``scope``
(:data:`dpnoise.accounting.ACCOUNTANTS`): the released outputs, not the trained parameters.
New mechanisms plug in with :func:`register_mechanism`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch
from torch import nn

from dpnoise.mechanisms.dirichlet import DirichletOutput
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.noise import gaussian_noise, laplace_noise
from dpnoise.mechanisms.penultimate import PenultimateGaussian

#: (reference tensor, noise, clip, generator) -> noise tensor shaped like the reference.
NoiseSampler = Callable[[torch.Tensor, float, float, Optional[torch.Generator]], torch.Tensor]
#: (module, noise=, clip=, alpha=, generator=) -> wrapped module.
ModuleWrapper = Callable[..., nn.Module]


@dataclass(frozen=True)
class Mechanism:
    """How one training mechanism clips, perturbs and is accounted."""

    name: str
    description: str
    noise_unit: str
    releases: Literal["gradients", "outputs"]
    #: accounting mechanism name passed to ``accountants_for_mechanism`` and ``acc.step`` (the
    #: accountant takes ``noise`` in the mechanism's own units).
    accounted_as: str
    #: per-example gradient clipping norm (2 or 1); ``None`` for output mechanisms.
    clip_norm_ord: Optional[int] = None
    #: noise on the sum of clipped gradients; ``None`` for output mechanisms.
    sample_noise: Optional[NoiseSampler] = None
    #: wraps the model so its training-mode forward applies the mechanism (output mechanisms).
    wrap_module: Optional[ModuleWrapper] = None

    @property
    def needs_per_sample_gradients(self) -> bool:
        return self.releases == "gradients"


MECHANISMS: dict[str, Mechanism] = {}


def register_mechanism(mechanism: Mechanism) -> Mechanism:
    """Add ``mechanism`` to :data:`MECHANISMS` (its name must be new)."""
    if mechanism.name in MECHANISMS:
        raise InvalidMechanismError(f"mechanism {mechanism.name!r} is already registered")
    if mechanism.releases == "gradients" and (mechanism.clip_norm_ord is None or mechanism.sample_noise is None):
        raise InvalidMechanismError(f"gradient mechanism {mechanism.name!r} needs clip_norm_ord and sample_noise")
    if mechanism.releases == "outputs" and mechanism.wrap_module is None:
        raise InvalidMechanismError(f"output mechanism {mechanism.name!r} needs wrap_module")
    MECHANISMS[mechanism.name] = mechanism
    return mechanism


def get_mechanism(name: str) -> Mechanism:
    """The registered mechanism ``name``; a clear error lists the known ones."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise InvalidMechanismError(f"unknown mechanism {name!r}; known: {', '.join(sorted(MECHANISMS))}") from None


def _wrap_dirichlet(module: nn.Module, *, noise: float, clip: float, alpha: float, generator) -> nn.Module:
    del clip  # softmax outputs are bounded by construction
    return DirichletOutput(module, r=noise, alpha=alpha, generator=generator)


def _wrap_penultimate(module: nn.Module, *, noise: float, clip: float, alpha: float, generator) -> nn.Module:
    del alpha
    return PenultimateGaussian(module, sigma=noise, clip=clip, generator=generator)


register_mechanism(Mechanism(
    name="gaussian",
    description="DP-SGD: per-example L2 clipping to C, Gaussian noise on the sum",
    noise_unit="noise multiplier sigma (std of the noise on the sum is sigma*C)",
    releases="gradients",
    accounted_as="gaussian",
    clip_norm_ord=2,
    sample_noise=gaussian_noise,
))
register_mechanism(Mechanism(
    name="lap2",
    description="Lap2: per-example L2 clipping to C, i.i.d. Laplace noise on the sum",
    noise_unit="absolute Laplace scale b per coordinate (accountants depend on b/C)",
    releases="gradients",
    accounted_as="lap2",
    clip_norm_ord=2,
    sample_noise=laplace_noise,
))
register_mechanism(Mechanism(
    name="laplace-l1",
    description="Laplace DP-SGD baseline: exact per-example L1 clipping to C, Laplace noise on the sum",
    noise_unit="absolute Laplace scale b per coordinate (accountant depends on b/C)",
    releases="gradients",
    accounted_as="laplace-l1",
    clip_norm_ord=1,
    sample_noise=laplace_noise,
))
register_mechanism(Mechanism(
    name="dirichlet",
    description="Dirichlet output mechanism: p~ ~ Dir(r softmax(z) + alpha), loss -log p~_y",
    noise_unit="Dirichlet scale r (with offset alpha; smaller r = more private)",
    releases="outputs",
    accounted_as="dirichlet",
    wrap_module=_wrap_dirichlet,
))
register_mechanism(Mechanism(
    name="penultimate-gaussian",
    description="Penultimate-layer Gaussian (Monir & Ghinita, reconstructed): clip activations to C, add N(0, sigma^2 C^2)",
    noise_unit="noise multiplier sigma on the activations (accounted as a Gaussian with sigma/2: sensitivity 2C)",
    releases="outputs",
    accounted_as="penultimate-gaussian",
    wrap_module=_wrap_penultimate,
))
