"""The DP event of an adaptive-clipping step (Andrew et al., "Differentially Private Learning with Adaptive
Clipping", arXiv 1905.03871): one Poisson batch, two releases, the noisy clipped gradient sum and the noisy
count of the batch's examples whose gradient norm is at most C.  Adding or removing one example moves the
count by at most 1 (the count's sensitivity) and the clipped sum by at most C.

The step is the subsampled *composition*: the changed example is in both releases or in neither, so the
event is ``PoissonSampledEvent(q, inner)`` with ``inner`` the two mechanisms together, never the two
separately subsampled (which would understate the privacy loss, :mod:`dpnoise.accounting.rdp.composed`).
Where the pair is itself one of the accounted mechanisms (after dividing each coordinate by its noise scale,
an invertible map: the pair and its image have the same privacy), ``inner`` is that mechanism's event, which
every accountant, PLD routes included, already accounts; otherwise it is their ``ComposedEvent``, accounted by
the jointly subsampled RDP route.
"""

from __future__ import annotations

import math
from typing import Union

from dpnoise.accounting.events import ComposedEvent, GaussianEvent, Lap2Event, LaplaceEvent, PoissonSampledEvent
from dpnoise.accounting.validation import InvalidParameterError, check_positive, check_sample_rate

#: how the count is noised: Gaussian (std sigma_b) or Laplace (scale b_count), on a count of sensitivity 1
COUNT_NOISE_LAWS = ("gaussian", "laplace")

GradientEvent = Union[GaussianEvent, LaplaceEvent, Lap2Event]
CountEvent = Union[GaussianEvent, LaplaceEvent]


def count_event(law: str, noise: float) -> CountEvent:
    """The event of the noisy count: a count has sensitivity 1 (one example is in it or not), so the noise
    (sigma_b, or the Laplace scale b_count) is its own noise multiplier."""
    noise = check_positive("quantile_noise", noise)
    if law == "gaussian":
        return GaussianEvent(noise)
    if law == "laplace":
        return LaplaceEvent(noise)
    raise InvalidParameterError(f"quantile_noise_law must be one of {', '.join(COUNT_NOISE_LAWS)}, got {law!r}")


def joint_release(gradient: GradientEvent, count: CountEvent) -> Union[GradientEvent, ComposedEvent]:
    """The event of the gradient sum and the count released on the same data with independent noises.

    Each coordinate divided by its noise scale, the pair is unit noise shifted by (g / s, c / s_b), with
    ||g|| <= C and c in {0, 1}:

    * Gaussian sum (std sigma C) and Gaussian count (std sigma_b): a Gaussian shifted by a vector of L2 norm
      at most sqrt(sigma^-2 + sigma_b^-2), whose privacy depends on that norm only: one Gaussian of
      multiplier (sigma^-2 + sigma_b^-2)^(-1/2) (arXiv 1905.03871, Theorem 1, with a count of sensitivity 1);
    * Laplace-L1 sum (scale b, L1 norm C) and Laplace count (scale b_count): unit Laplace noise shifted by at
      most C / b + 1 / b_count in L1 norm: the L1 Laplace mechanism of multiplier 1 / (C / b + 1 / b_count);
    * Lap2 sum (scale b, L2 norm C, n coordinates) and Laplace count: unit Laplace noise on n + 1 coordinates
      shifted by at most sqrt((C / b)^2 + b_count^-2) in L2 norm: Lap2 of that multiplier on n + 1 coordinates;
    * any other pair (a Gaussian count with a Laplace sum): their ``ComposedEvent``.
    """
    if isinstance(gradient, GaussianEvent) and isinstance(count, GaussianEvent):
        return GaussianEvent(1.0 / math.hypot(1.0 / gradient.noise_multiplier, 1.0 / count.noise_multiplier))
    if isinstance(gradient, LaplaceEvent) and isinstance(count, LaplaceEvent):
        return LaplaceEvent(1.0 / (1.0 / gradient.noise_multiplier + 1.0 / count.noise_multiplier))
    if isinstance(gradient, Lap2Event) and isinstance(count, LaplaceEvent):
        return Lap2Event(1.0 / math.hypot(1.0 / gradient.noise_multiplier, 1.0 / count.noise_multiplier),
                         gradient.num_params + 1)
    return ComposedEvent((gradient, count))


def adaptive_step_event(sample_rate: float, gradient: GradientEvent, count: CountEvent) -> PoissonSampledEvent:
    """One adaptive-clipping step: the gradient sum and the count released on one Poisson subsample."""
    return PoissonSampledEvent(check_sample_rate("sample_rate", sample_rate), joint_release(gradient, count))


__all__ = ["COUNT_NOISE_LAWS", "adaptive_step_event", "count_event", "joint_release"]
