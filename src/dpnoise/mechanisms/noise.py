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
4e-6 / sigma per step in which the example is sampled).

Two float64 sources, chosen by size (:data:`NUMPY_MIN_ENTRIES`), both keyed by the caller's torch
generator, which stays the one state to seed, checkpoint and restore:

* torch's samplers, on any device: the Gaussian by Box-Muller from 53-bit uniforms (support 8.5
  sigma), the exponential by inversion (support 36.7).
* on the CPU, for tensors of at least 2^16 entries, NumPy's ziggurat samplers (Marsaglia & Tsang
  2000; about twice as fast as torch's float64 samplers, which is a third of a full fine-tuning
  step): a PCG64 stream keyed by 256 bits drawn from the torch generator, one stream per call.
  Their tails are drawn exactly from 53-bit uniforms: the Gaussian reaches 12.2 sigma and the
  exponential 44.4.

Beyond either support the tails hold less than 1e-16.

All samplers take an explicit ``torch.Generator`` (on the reference's device) so that runs are
reproducible and checkpointable.  They are ordinary floating-point samplers: they do not defend
against floating-point attacks on the noise's low-order bits.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from dpnoise.accounting.validation import check_count


#: tensors of at least this many entries are drawn on the CPU by NumPy (below it, keying a NumPy stream,
#: about 0.07 ms, costs more than NumPy saves)
NUMPY_MIN_ENTRIES = 1 << 16


class Float64Draws:
    """float64 draws shaped like a reference tensor and on its device, from torch's samplers."""

    def __init__(self, reference: torch.Tensor, generator: Optional[torch.Generator]):
        self.shape, self.device, self.generator = tuple(reference.shape), reference.device, generator

    def normal(self, std: float) -> torch.Tensor:
        return torch.normal(0.0, std, size=self.shape, generator=self.generator, dtype=torch.float64,
                            device=self.device)

    def uniform(self) -> torch.Tensor:
        return torch.rand(self.shape, generator=self.generator, dtype=torch.float64, device=self.device)

    def exponential(self) -> torch.Tensor:
        """-log(1 - U) (a third of the time of ``Tensor.exponential_`` in float64 on the CPU)."""
        return self.uniform().neg_().log1p_().neg_()

    def gamma(self, concentration: float) -> torch.Tensor:
        shape = torch.full(self.shape, concentration, dtype=torch.float64, device=self.device)
        return torch._standard_gamma(shape, generator=self.generator)


class NumpyFloat64Draws(Float64Draws):
    """The same draws from NumPy's ziggurat samplers on one PCG64 stream keyed by the torch generator."""

    def __init__(self, reference: torch.Tensor, generator: Optional[torch.Generator]):
        super().__init__(reference, generator)
        key = torch.randint(-2**63, 2**63 - 1, (4,), dtype=torch.int64, generator=generator)
        self.stream = np.random.Generator(np.random.PCG64(key.numpy().view(np.uint64)))

    def normal(self, std: float) -> torch.Tensor:
        return torch.from_numpy(self.stream.standard_normal(self.shape)).mul_(std)

    def uniform(self) -> torch.Tensor:
        return torch.from_numpy(self.stream.random(self.shape))

    def exponential(self) -> torch.Tensor:
        return torch.from_numpy(self.stream.standard_exponential(self.shape))

    def gamma(self, concentration: float) -> torch.Tensor:
        return torch.from_numpy(self.stream.standard_gamma(concentration, self.shape))


def float64_draws(reference: torch.Tensor, generator: Optional[torch.Generator]) -> Float64Draws:
    """The float64 source for ``reference``: NumPy for large CPU tensors, torch otherwise (module docstring)."""
    if reference.device.type == "cpu" and reference.numel() >= NUMPY_MIN_ENTRIES:
        return NumpyFloat64Draws(reference, generator)
    return Float64Draws(reference, generator)


def gaussian_noise(
    reference: torch.Tensor, noise_multiplier: float, clip: float, generator: Optional[torch.Generator],
    shares: int = 1,
) -> torch.Tensor:
    """One of ``shares`` shares of N(0, (noise_multiplier * clip)^2) i.i.d., shaped like ``reference``:
    N(0, (noise_multiplier * clip)^2 / shares), drawn in float64 and cast to ``reference.dtype``."""
    std = noise_multiplier * clip / math.sqrt(check_count("shares", shares, 1))
    return float64_draws(reference, generator).normal(std).to(reference.dtype)


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
    return standard_laplace_share(reference, shares, generator).mul_(scale).to(reference.dtype)


def standard_laplace_share(reference: torch.Tensor, shares: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    """G1 - G2 with G1, G2 ~ Gamma(1 / shares, 1) independent, in float64, shaped like ``reference``
    and on its device: one of ``shares`` shares of Lap(0, 1).

    * One share: E1 - E2 with E ~ Exp(1).
    * Two shares: Gamma(1/2, 1) is Z^2 / 2 with Z ~ N(0, 1); for the Box-Muller pair
      Z1 = sqrt(2E) cos(theta), Z2 = sqrt(2E) sin(theta) (E ~ Exp(1), theta = 2 pi U, U ~ U[0, 1),
      Z1 and Z2 independent), Z1^2 / 2 - Z2^2 / 2 = E cos(2 theta) = E cos(4 pi U): two uniforms a
      coordinate, as for one share, instead of two normals (torch's float64 normal sampler costs
      about three float64 uniforms).
    * More: a Gamma sampler.
    """
    draws = float64_draws(reference, generator)
    if shares == 1:
        return draws.exponential().sub_(draws.exponential())
    if shares == 2:
        return draws.exponential().mul_(draws.uniform().mul_(4 * math.pi).cos_())
    return draws.gamma(1.0 / shares).sub_(draws.gamma(1.0 / shares))


def standard_exponential(reference: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Exp(1) variables in float64, shaped like ``reference`` and on its device (:func:`float64_draws`).

    From torch: -log(1 - U) with U ~ U[0, 1) a float64 uniform (53 random bits on the CPU, so
    1 - U >= 2^-53 is exact and the support is [0, 53 log 2] = [0, 36.7]; P(Exp(1) > 36.7) =
    1.1e-16).  From NumPy: the ziggurat, whose tail is r - log(1 - U) (support [0, 44.4])."""
    return float64_draws(reference, generator).exponential()
