"""How a step's clipped gradient sums are released: one object per kind of release, handed to the noisy sum.

* :class:`FloatRelease` -- each sum plus the mechanism's float noise from a torch generator (a process
  of K may add one of K independent shares of it, or none);
* :class:`GridRelease` -- secure mode: all the sums at once on the plan's grid with exact integer noise
  from the operating system's random bytes (:func:`~dpnoise.mechanisms.secure_noise.secure_noisy_sums`).

The accountants learn which one was used from the step's DP event
(:class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent` for the discrete Gaussian); the
optimizers only call the release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch

from dpnoise.mechanisms.registry import NoiseSampler
from dpnoise.mechanisms.secure_noise import Plan, RandomBits, SystemRandomBits, secure_noisy_sums


class Release(Protocol):
    """The noisy sums of a step's clipped sums (each shaped, typed and placed like its sum)."""

    def __call__(self, sums: Sequence[torch.Tensor]) -> list[torch.Tensor]: ...


@dataclass
class FloatRelease:
    """``S + noise`` for each sum ``S``: ``sample_noise(S, noise, clip, generator, shares)``, the mechanism's
    float sampler (:data:`~dpnoise.mechanisms.registry.NOISE_SAMPLERS`); with ``shares`` K > 1, one of K
    independent shares of that noise, or none where ``adds_share`` is False (distributed training)."""

    sample_noise: NoiseSampler
    noise: float
    clip: float
    generator: Optional[torch.Generator]
    shares: int = 1
    adds_share: bool = True

    def __call__(self, sums: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [summed + self.noise_of(summed) for summed in sums]

    def noise_of(self, summed: torch.Tensor) -> torch.Tensor:
        """The noise (or this process's share of it) for one sum."""
        if not self.adds_share:
            return torch.zeros_like(summed)
        return self.sample_noise(summed, self.noise, self.clip, self.generator, self.shares)


@dataclass
class GridRelease:
    """Secure mode's release of all the sums at once on ``plan``'s grid, with random bytes from ``bits``
    (default: the OS's CSPRNG, nothing to seed or checkpoint)."""

    plan: Plan
    bits: RandomBits = field(default_factory=SystemRandomBits)

    def __call__(self, sums: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return secure_noisy_sums(list(sums), self.plan, self.bits)


__all__ = ["FloatRelease", "GridRelease", "Release"]
