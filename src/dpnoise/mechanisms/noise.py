"""Noise samplers for the SUM of clipped per-example gradients.

Units (the same as the accountants' ``noise`` and the CLI's ``--noise``):

* Gaussian: ``noise`` is the noise multiplier sigma; every coordinate gets N(0, (sigma * C)^2).
* Laplace (``lap2`` and ``laplace-l1``): ``noise`` is the ABSOLUTE scale b; every coordinate gets
  Lap(0, b) independently, whatever the clipping norm C.

Shares (distributed training, docs/DISTRIBUTED.md): with ``shares=K`` a sampler returns ONE of K
independent shares whose sum has the law above: a Gaussian share is N(0, (sigma C)^2 / K); a
Laplace share is b (G1 - G2) with G1, G2 ~ Gamma(1/K, 1), because a sum of K independent
Gamma(1/K, 1) is Gamma(1, 1) = Exp(1) and Exp(1) - Exp(1) is Lap(1) (the Laplace law is infinitely
divisible).  The shares must come from independently seeded generators.  ``shares=1`` is the whole
noise.

Precision: every sample is drawn in float64 on the reference's device and then cast to the
reference's dtype.  In float32, torch's CPU Gaussian sampler fills tensors of 16 or more entries
from 24-bit uniforms and never exceeds 5.77 sigma: a truncated noise has outputs that are
impossible under one neighbour, which adds to delta (for the tutorial CNN, n = 26010, about
4e-6 / sigma per step in which the example is sampled).  In float64 the support reaches 8.5 sigma
(Gaussian) and 36 b (Laplace), beyond which the tails hold about 1e-16.

All samplers take an explicit ``torch.Generator`` (on the reference's device) so that runs are
reproducible and checkpointable.  They are ordinary floating-point samplers: they do not defend
against floating-point attacks on the noise's low-order bits.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dpnoise.accounting.validation import check_count


def gaussian_noise(
    reference: torch.Tensor, noise_multiplier: float, clip: float, generator: Optional[torch.Generator],
    shares: int = 1,
) -> torch.Tensor:
    """One of ``shares`` shares of N(0, (noise_multiplier * clip)^2) i.i.d., shaped like ``reference``:
    N(0, (noise_multiplier * clip)^2 / shares), drawn in float64 and cast to ``reference.dtype``."""
    std = noise_multiplier * clip / math.sqrt(check_count("shares", shares, 1))
    drawn = torch.normal(0.0, std, size=reference.shape, generator=generator, dtype=torch.float64,
                         device=reference.device)
    return drawn.to(reference.dtype)


def laplace_noise(
    reference: torch.Tensor, scale: float, clip: float, generator: Optional[torch.Generator], shares: int = 1,
) -> torch.Tensor:
    """One of ``shares`` shares of Lap(0, scale) i.i.d., shaped like ``reference``; ``clip`` is unused
    (b is absolute).

    ``scale * (G1 - G2)`` with G1, G2 ~ Gamma(1 / shares, 1), drawn in float64
    (:func:`standard_laplace_share`), then cast to ``reference.dtype``.
    """
    del clip  # the Laplace scale is absolute, see the module docstring
    shares = check_count("shares", shares, 1)
    return (standard_laplace_share(reference, shares, generator) * scale).to(reference.dtype)


def standard_laplace_share(reference: torch.Tensor, shares: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    """G1 - G2 with G1, G2 ~ Gamma(1 / shares, 1) independent, in float64, shaped like ``reference``
    and on its device: one of ``shares`` shares of Lap(0, 1).

    * One share: E1 - E2 with E ~ Exp(1) (:func:`standard_exponential`).
    * Two shares: Gamma(1/2, 1) is Z^2 / 2 with Z ~ N(0, 1); for the Box-Muller pair
      Z1 = sqrt(2E) cos(theta), Z2 = sqrt(2E) sin(theta) (E ~ Exp(1), theta = 2 pi U, U ~ U[0, 1),
      Z1 and Z2 independent), Z1^2 / 2 - Z2^2 / 2 = E cos(2 theta) = E cos(4 pi U): two uniforms a
      coordinate, as for one share, instead of two normals (torch's float64 normal sampler costs
      about three float64 uniforms).
    * More: torch's Gamma sampler.
    """
    if shares == 1:
        return standard_exponential(reference, generator) - standard_exponential(reference, generator)
    if shares == 2:
        exponential = standard_exponential(reference, generator)
        return exponential * torch.rand(reference.shape, generator=generator, dtype=torch.float64,
                                        device=reference.device).mul_(4 * math.pi).cos_()
    concentration = torch.full(reference.shape, 1.0 / shares, dtype=torch.float64, device=reference.device)
    return torch._standard_gamma(concentration, generator=generator) - torch._standard_gamma(concentration,
                                                                                            generator=generator)


def standard_exponential(reference: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Exp(1) variables in float64, shaped like ``reference`` and on its device, by inversion:
    -log(1 - U) with U ~ U[0, 1) a float64 uniform (53 random bits on the CPU, so 1 - U >= 2^-53 is
    exact and the support is [0, 53 log 2] = [0, 36.7]; P(Exp(1) > 36.7) = 1.1e-16).  A third of the
    time of ``Tensor.exponential_`` in float64 on the CPU."""
    uniform = torch.rand(reference.shape, generator=generator, dtype=torch.float64, device=reference.device)
    return uniform.neg_().log1p_().neg_()
