"""Noisy per-channel feature statistics: the clipped sums' sensitivity, the noisy quantile, what is
released (four Gaussian mechanisms, cross-checked with dp_accounting), the standardisation layer, bad input."""

import math

import numpy as np
import pytest
import torch

from dpnoise.accounting import get_accountant
from dpnoise.accounting.events import GaussianEvent, SelfComposedEvent
from dpnoise.mechanisms.channel_statistics import (
    NORM_BIN_EDGES,
    RELEASES,
    ChannelStandardization,
    noisy_clipped_mean,
    noisy_quantile,
    private_channel_statistics,
)
from dpnoise.mechanisms.errors import InvalidMechanismError

TINY_NOISE = 1e-9


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def features(n: int = 2000, channels: int = 6, side: int = 3, seed: int = 0) -> torch.Tensor:
    """Channels with different means and scales, like scattering coefficients (non-negative)."""
    g = generator(seed)
    scales = torch.logspace(-3, 0, channels).view(1, -1, 1, 1)
    return (torch.rand(n, channels, side, side, generator=g, dtype=torch.float64) + 0.5) * scales


def test_noisy_quantile_is_the_bin_edge_above_the_true_quantile():
    values = torch.rand(5000, generator=generator(1), dtype=torch.float64) * 3 + 0.01
    for quantile in (0.1, 0.5, 0.9):
        threshold = noisy_quantile(values, quantile, TINY_NOISE, generator())
        below = float((values <= threshold).double().mean())
        assert below >= quantile  # the cumulative count reached the quantile within the bin
        edge = int(torch.searchsorted(NORM_BIN_EDGES, torch.tensor(threshold, dtype=torch.float64)))
        assert float((values <= NORM_BIN_EDGES[edge - 1]).double().mean()) < quantile  # not one bin later


@pytest.mark.parametrize("added", [0.0, 1e-20, 1.0, float(NORM_BIN_EDGES[100]), 1e10, 1.7e308])
def test_one_added_value_moves_exactly_one_count_by_one(monkeypatch, added):
    """The histogram's L2 sensitivity is 1: record the counts the noise is added to."""
    seen = []

    def recording_noise(reference, noise_multiplier, clip, generator, shares=1):
        seen.append(reference.clone())
        return torch.zeros_like(reference)

    monkeypatch.setattr("dpnoise.mechanisms.channel_statistics.gaussian_noise", recording_noise)
    values = torch.rand(500, generator=generator(7), dtype=torch.float64) + 0.1
    for data in (values, torch.cat([values, torch.tensor([added], dtype=torch.float64)])):
        noisy_quantile(data, 0.5, 1.0, generator())
    difference = seen[1] - seen[0]
    assert float(difference.abs().sum()) == 1.0 and float(difference.max()) == 1.0


def test_the_four_draws_are_the_noise_the_event_describes(monkeypatch):
    """Exactly RELEASES Gaussian draws: std sigma on each count, sigma * C on each clipped sum."""
    from dpnoise.mechanisms import channel_statistics

    draws = []
    real = channel_statistics.gaussian_noise

    def recording_noise(reference, noise_multiplier, clip, generator, shares=1):
        draws.append((noise_multiplier, clip, shares, reference.dtype))
        return real(reference, noise_multiplier, clip, generator, shares)

    monkeypatch.setattr(channel_statistics, "gaussian_noise", recording_noise)
    stats = private_channel_statistics(features(), 3.0, generator())
    assert draws == [(3.0, 1.0, 1, torch.float64), (3.0, 1.0, 1, torch.float64),
                     (3.0, stats.clip_mean, 1, torch.float64), (3.0, stats.clip_square, 1, torch.float64)]
    assert len(draws) == RELEASES


@pytest.mark.parametrize("scale", [0.0, 1e-12, 1e6])
def test_norms_outside_the_bins_are_refused(scale):
    with pytest.raises(InvalidMechanismError, match="outside .* rescale the features"):
        private_channel_statistics(features() * scale, 8.0, generator())


def test_clipped_sum_moves_by_at_most_the_clip_when_one_example_is_added():
    rows = torch.randn(300, 8, generator=generator(2), dtype=torch.float64)
    outlier = 1e6 * torch.ones(1, 8, dtype=torch.float64)
    clip = 0.7
    without = noisy_clipped_mean(rows, clip, TINY_NOISE, generator()) * len(rows)
    with_it = noisy_clipped_mean(torch.cat([rows, outlier]), clip, TINY_NOISE, generator()) * (len(rows) + 1)
    assert float((with_it - without).norm()) == pytest.approx(clip, rel=1e-6)


def test_clipped_mean_with_a_large_clip_is_the_mean():
    rows = torch.randn(300, 8, generator=generator(3), dtype=torch.float64)
    mean = noisy_clipped_mean(rows, 1e3, TINY_NOISE, generator())
    assert torch.allclose(mean, rows.mean(0), atol=1e-9)


def test_clipped_mean_noise_has_std_sigma_clip_over_n():
    rows = torch.zeros(50, 20000, dtype=torch.float64)
    mean = noisy_clipped_mean(rows, 2.0, 3.0, generator(4))
    assert float(mean.std()) == pytest.approx(3.0 * 2.0 / 50, rel=0.03)


def test_statistics_with_little_noise_and_a_high_quantile_are_the_exact_ones():
    x = features()
    stats = private_channel_statistics(x, TINY_NOISE, generator(), quantile=0.999)
    flat = x.transpose(0, 1).flatten(1)
    assert torch.allclose(stats.mean.double(), flat.mean(1), rtol=1e-3, atol=1e-7)
    assert torch.allclose(stats.variance.double(), flat.var(1, unbiased=False), rtol=1e-2, atol=1e-8)
    assert stats.clip_mean >= float(x.flatten(2).mean(2).norm(dim=1).quantile(0.999))


def test_statistics_are_reproducible_from_the_generator_and_differ_between_seeds():
    x = features()
    a, b = (private_channel_statistics(x, 8.0, generator(5)) for _ in range(2))
    c = private_channel_statistics(x, 8.0, generator(6))
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)
    assert not torch.equal(a.mean, c.mean)
    assert (a.variance >= 0).all()


def test_the_release_is_four_gaussian_mechanisms():
    stats = private_channel_statistics(features(), 8.0, generator())
    assert stats.event == SelfComposedEvent(GaussianEvent(8.0), RELEASES) and RELEASES == 4


@pytest.mark.parametrize("sigma", [2.0, 8.0])
def test_the_release_epsilon_is_that_of_one_gaussian_of_sigma_over_two_in_dp_accounting(sigma):
    """Four Gaussian mechanisms of multiplier sigma compose to one of sigma / sqrt(4) (exact for Gaussians)."""
    dp_accounting = pytest.importorskip("dp_accounting")
    event = private_channel_statistics(features(), sigma, generator()).event
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(RELEASES)))
    expected = reference.get_epsilon(1e-5)
    for name in ("gaussian", "gaussian-pld", "lap2", "laplace-l1"):
        ours = get_accountant(name).compose(event).get_epsilon(1e-5)
        assert expected - 1e-3 <= ours <= expected * 1.01 + 1e-3, name
    rdp = get_accountant("gaussian-rdp").compose(event)
    orders = rdp.orders
    assert np.allclose(rdp.get_rdp(), RELEASES * orders / (2 * sigma**2))


def test_the_release_is_not_a_training_step():
    acc = get_accountant("gaussian").compose(SelfComposedEvent(GaussianEvent(8.0), RELEASES))
    assert acc.steps == 0 and acc.get_epsilon(1e-5) > 0
    acc.step(noise_multiplier=1.0, sample_rate=0.01, steps=3)
    assert acc.steps == 3


def test_standardization_centres_and_scales_each_channel():
    x = features().float()
    flat = x.transpose(0, 1).flatten(1)
    layer = ChannelStandardization(flat.mean(1), flat.var(1, unbiased=False))
    out = layer(x).transpose(0, 1).flatten(1)
    assert torch.allclose(out.mean(1), torch.zeros(out.shape[0]), atol=1e-3)
    # sqrt(var + 1e-5): channels of variance far above 1e-5 get unit variance, the others less
    big = flat.var(1) > 1e-3
    assert torch.allclose(out.var(1)[big], torch.ones(int(big.sum())), rtol=2e-2)
    assert (out.var(1)[~big] < 1).all()
    vectors = ChannelStandardization(torch.zeros(4), torch.ones(4))(torch.ones(2, 4))
    assert vectors.shape == (2, 4)
    assert not any(p.requires_grad for p in layer.parameters())


@pytest.mark.parametrize("bad, match", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(quantile=0.0), "quantile"),
    (dict(quantile=1.0), "quantile"),
    (dict(quantile=float("nan")), "quantile"),
    (dict(quantile="0.5"), "quantile"),
])
def test_bad_parameters_are_refused(bad, match):
    options = {"noise_multiplier": 8.0, "quantile": 0.5, **bad}
    with pytest.raises(Exception, match=match):
        private_channel_statistics(features(n=10), options["noise_multiplier"], generator(),
                                   quantile=options["quantile"])


@pytest.mark.parametrize("x", [torch.zeros(0, 3, 2, 2), torch.zeros(5), torch.full((4, 3, 2, 2), float("nan"))])
def test_bad_features_are_refused(x):
    with pytest.raises(InvalidMechanismError, match="features"):
        private_channel_statistics(x, 8.0, generator())


def test_standardization_needs_matching_vectors():
    with pytest.raises(InvalidMechanismError, match="mean and variance"):
        ChannelStandardization(torch.zeros(3), torch.ones(4))
