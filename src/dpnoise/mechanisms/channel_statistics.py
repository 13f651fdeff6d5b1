"""Per-channel feature statistics released with Gaussian noise, to standardise a model's input.

Tramèr & Boneh (arXiv 2011.11660, Sec. 3 and their code's ``scatter_normalization``) standardise the
ScatterNet features channel by channel with means and variances computed from the private training
set with Gaussian noise, and compose that release with DP-SGD.  Their clipping thresholds are the
medians of the private per-example norms, a release they do not account for.  Here every release is
accounted; for each of the two per-example vectors (the spatial means of each channel, a_i, and of
each channel's squares, b_i):

1. the clipping threshold is a noisy quantile: the counts of the per-example norms in fixed
   log-spaced bins (:data:`NORM_BIN_EDGES`, chosen without data), each count plus N(0, sigma^2)
   (one example moves one count by 1: L2 sensitivity 1); the threshold is the upper edge of the bin
   where the noisy cumulative count reaches the quantile times n;
2. the sum of the vectors clipped to that threshold C, plus N(0, sigma^2 C^2) per channel
   (sensitivity C), divided by n.

That is four Gaussian mechanisms of noise multiplier sigma on the whole data set (no subsampling),
under add/remove adjacency: :attr:`ChannelStatistics.event`, which the training accountants compose
before the first step (``make_private(data_releases=...)``).  n, the data set's size, is treated as
public, as in the expected batch size of DP-SGD.  The variance is max(E[b] - E[a]^2, 0), and
standardisation divides by sqrt(variance + 1e-5) as Tramèr & Boneh do, so channels whose variance is
far below 1e-5 (where the noise is as large as the variance) are scaled by a nearly fixed factor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpnoise.accounting.events import GaussianEvent, SelfComposedEvent
from dpnoise.accounting.validation import check_positive
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.noise import gaussian_noise

#: Bins of the noisy quantile: 20 per decade from 1e-8 to 1e4, fixed in advance (no data).
NORM_BIN_EDGES = torch.logspace(-8.0, 4.0, 241, dtype=torch.float64)
#: Gaussian releases per statistics: two noisy quantiles (thresholds), two noisy clipped sums.
RELEASES = 4
#: Added to the variance before the square root (Tramèr & Boneh's value).
VARIANCE_FLOOR = 1e-5


@dataclass(frozen=True)
class ChannelStatistics:
    """Noisy per-channel mean and variance of features ``(n, channels, *spatial)``, and what it cost."""

    mean: torch.Tensor
    variance: torch.Tensor
    #: the noise multiplier of each of the :data:`RELEASES` Gaussian releases
    noise_multiplier: float
    #: the noisy-quantile clipping thresholds of the per-example channel means and mean squares
    clip_mean: float
    clip_square: float

    @property
    def event(self) -> SelfComposedEvent:
        """What was released, as a DP event: :data:`RELEASES` Gaussian mechanisms, no subsampling."""
        return SelfComposedEvent(GaussianEvent(self.noise_multiplier), RELEASES)


def noisy_quantile(values: torch.Tensor, quantile: float, noise_multiplier: float,
                   generator: torch.Generator) -> float:
    """The ``quantile`` of non-negative ``values`` from their histogram over :data:`NORM_BIN_EDGES` with
    N(0, noise_multiplier^2) added to each count (one Gaussian release of L2 sensitivity 1).

    Returns the upper edge of the first bin where the noisy cumulative count reaches ``quantile * n``;
    values outside the edges count in the first or last bin.  An answer in the first or the last bin
    is refused (:class:`InvalidMechanismError`): the values are outside the range the bins resolve.
    """
    edges = NORM_BIN_EDGES
    bins = torch.bucketize(values.double().flatten(), edges[1:-1])
    counts = torch.bincount(bins, minlength=len(edges) - 1).double()
    noisy = counts + gaussian_noise(counts, noise_multiplier, 1.0, generator)
    reached = torch.nonzero(noisy.cumsum(0) >= quantile * len(values))
    index = int(reached[0]) if len(reached) else len(counts) - 1
    if index in (0, len(counts) - 1):
        raise InvalidMechanismError(f"the per-example norms' {quantile:g} quantile is outside [{float(edges[1]):.3g}, "
                                    f"{float(edges[-2]):.3g}], the range of the noisy-quantile bins: rescale the features")
    return float(edges[index + 1])


def noisy_clipped_mean(vectors: torch.Tensor, clip: float, noise_multiplier: float,
                       generator: torch.Generator) -> torch.Tensor:
    """(sum of the rows of ``vectors`` clipped to L2 norm ``clip`` + N(0, (noise_multiplier clip)^2)) / n."""
    norms = vectors.norm(dim=1, keepdim=True)
    clipped = vectors * (clip / norms.clamp_min(clip))
    total = clipped.sum(0)
    return (total + gaussian_noise(total, noise_multiplier, clip, generator)) / len(vectors)


def private_channel_statistics(features: torch.Tensor, noise_multiplier: float, generator: torch.Generator,
                               quantile: float = 0.5) -> ChannelStatistics:
    """Noisy per-channel mean and variance of ``features`` ``(n, channels, *spatial)``: thresholds by
    :func:`noisy_quantile` (the ``quantile`` of the per-example norms), then :func:`noisy_clipped_mean` of
    the per-example channel means and mean squares, all with ``noise_multiplier``, in float64."""
    noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
    if not isinstance(quantile, (int, float)) or not 0.0 < quantile < 1.0:
        raise InvalidMechanismError(f"quantile must be in (0, 1), got {quantile!r}")
    if features.dim() < 2 or len(features) == 0:
        raise InvalidMechanismError(f"features must be a non-empty tensor (n, channels, ...), got shape "
                                    f"{tuple(features.shape)}")
    channel_means, channel_squares = channel_moments(features)
    if not (torch.isfinite(channel_means).all() and torch.isfinite(channel_squares).all()):
        raise InvalidMechanismError("features must be finite (a NaN or infinite value was found)")
    clip_mean = noisy_quantile(channel_means.norm(dim=1), quantile, noise_multiplier, generator)
    clip_square = noisy_quantile(channel_squares.norm(dim=1), quantile, noise_multiplier, generator)
    mean = noisy_clipped_mean(channel_means, clip_mean, noise_multiplier, generator)
    square = noisy_clipped_mean(channel_squares, clip_square, noise_multiplier, generator)
    variance = (square - mean * mean).clamp_min(0.0)
    return ChannelStatistics(mean.float(), variance.float(), noise_multiplier, clip_mean, clip_square)


def channel_moments(features: torch.Tensor, chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example and channel, the mean of the values and of their squares over the other dimensions
    (``(n, channels)`` each, float64), ``chunk`` examples at a time (a float64 copy of all features
    would take twice their memory)."""
    means, squares = [], []
    for start in range(0, len(features), chunk):
        block = features[start : start + chunk].double().flatten(2) if features.dim() > 2 \
            else features[start : start + chunk].double().unsqueeze(2)
        means.append(block.mean(2))
        squares.append((block * block).mean(2))
    return torch.cat(means), torch.cat(squares)


class ChannelStandardization(nn.Module):
    """(x - mean) / sqrt(variance + 1e-5) per channel (dimension 1), with fixed statistics (buffers)."""

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor) -> None:
        super().__init__()
        if mean.shape != variance.shape or mean.dim() != 1:
            raise InvalidMechanismError(f"mean and variance must be vectors of one shape, got {tuple(mean.shape)} "
                                        f"and {tuple(variance.shape)}")
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("scale", (variance.detach() + VARIANCE_FLOOR).rsqrt())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return (x - self.mean.view(shape)) * self.scale.view(shape)
