"""Noise samplers for the SUM of clipped per-example gradients.

Units (the same as the accountants' ``noise`` and the CLI's ``--noise``):

* Gaussian: ``noise`` is the noise multiplier sigma; every coordinate gets N(0, (sigma * C)^2).
* Laplace (``lap2`` and ``laplace-l1``): ``noise`` is the ABSOLUTE scale b; every coordinate gets
  Lap(0, b) independently, whatever the clipping norm C.

All samplers take an explicit ``torch.Generator`` so that runs are reproducible and checkpointable.
They are ordinary floating-point samplers: they do not defend against floating-point attacks on
the noise's low-order bits.
"""

from __future__ import annotations

from typing import Optional

import torch


def gaussian_noise(
    reference: torch.Tensor, noise_multiplier: float, clip: float, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """N(0, (noise_multiplier * clip)^2) i.i.d., shaped like ``reference``."""
    return torch.normal(
        0.0,
        noise_multiplier * clip,
        size=reference.shape,
        generator=generator,
        dtype=reference.dtype,
        device=reference.device,
    )


def laplace_noise(
    reference: torch.Tensor, scale: float, clip: float, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """Lap(0, scale) i.i.d., shaped like ``reference``; ``clip`` is unused (b is absolute).

    Sampled as the difference of two independent Exp(1) variables times ``scale``.
    """
    del clip  # the Laplace scale is absolute, see the module docstring
    first = torch.empty_like(reference).exponential_(generator=generator)
    second = torch.empty_like(reference).exponential_(generator=generator)
    return (first - second) * scale
