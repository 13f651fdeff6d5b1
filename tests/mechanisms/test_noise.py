"""Noise samplers: the right distribution in the documented units, drawn in float64, and shares that sum to it."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpnoise.mechanisms import gaussian_noise, laplace_noise
from dpnoise.mechanisms.noise import NUMPY_MIN_ENTRIES, standard_exponential


def test_laplace_scale_is_absolute():
    reference = torch.zeros(20_000)
    sample = laplace_noise(reference, 0.7, 5.0, torch.Generator().manual_seed(1)).numpy()
    assert stats.kstest(sample, stats.laplace(scale=0.7).cdf).pvalue > 1e-3


def test_gaussian_std_is_multiplier_times_clip():
    reference = torch.zeros(20_000)
    sample = gaussian_noise(reference, 1.3, 0.5, torch.Generator().manual_seed(2)).numpy()
    assert stats.kstest(sample, stats.norm(scale=0.65).cdf).pvalue > 1e-3


def test_samplers_follow_their_generator_and_reference():
    reference = torch.zeros(3, 4, dtype=torch.float64)
    for sampler in (laplace_noise, gaussian_noise):
        first = sampler(reference, 1.0, 1.0, torch.Generator().manual_seed(3))
        second = sampler(reference, 1.0, 1.0, torch.Generator().manual_seed(3))
        assert first.shape == reference.shape and first.dtype == torch.float64
        assert torch.equal(first, second)
        assert np.isfinite(first.numpy()).all()


@pytest.mark.parametrize("shares", [2, 3, 4])
def test_laplace_shares_from_distinct_generators_sum_to_laplace(shares):
    reference = torch.zeros(100_000)
    summed = sum(laplace_noise(reference, 0.7, 1.0, torch.Generator().manual_seed(seed), shares).double()
                 for seed in range(shares)).numpy()
    assert stats.kstest(summed, stats.laplace(scale=0.7).cdf).pvalue > 1e-3
    expected = len(summed) * math.exp(-6.0)
    assert abs(np.sum(np.abs(summed) > 6 * 0.7) - expected) < 5 * math.sqrt(expected)
    same_seed = laplace_noise(reference, 0.7, 1.0, torch.Generator().manual_seed(0), shares)
    assert stats.kstest(shares * same_seed.numpy(), stats.laplace(scale=0.7).cdf).pvalue < 1e-6  # the pitfall


@pytest.mark.parametrize("sampler", [gaussian_noise, laplace_noise])
@pytest.mark.parametrize("shares", [1, 2, 3])
def test_noise_is_drawn_in_float64_then_cast(sampler, shares):
    single = sampler(torch.zeros(5000), 1.3, 0.5, torch.Generator().manual_seed(4), shares)
    double = sampler(torch.zeros(5000, dtype=torch.float64), 1.3, 0.5, torch.Generator().manual_seed(4), shares)
    assert single.dtype == torch.float32 and double.dtype == torch.float64
    assert torch.equal(single, double.float())


@pytest.mark.parametrize("sampler", [gaussian_noise, laplace_noise])
def test_a_share_count_below_one_is_refused_by_name(sampler):
    with pytest.raises(ValueError, match="^shares must be"):
        sampler(torch.zeros(3), 1.0, 1.0, None, 0)


@pytest.mark.parametrize("shares", [1, 2, 3])
def test_one_laplace_share_is_a_difference_of_two_gamma_variables(shares):
    """One share alone has the law of b (G1 - G2), G ~ Gamma(1/K, 1) (drawn here by NumPy), in the bulk and
    the tails."""
    share = laplace_noise(torch.zeros(100_000), 0.7, 1.0, torch.Generator().manual_seed(5), shares).double().numpy()
    rng = np.random.default_rng(6)
    reference = 0.7 * (rng.gamma(1 / shares, size=400_000) - rng.gamma(1 / shares, size=400_000))
    assert stats.ks_2samp(share, reference).pvalue > 1e-3
    for t in (2.0, 4.0):
        expected = np.mean(np.abs(reference) > t * 0.7) * len(share)
        assert abs(np.sum(np.abs(share) > t * 0.7) - expected) < 5 * math.sqrt(expected) + 1, t


@pytest.mark.parametrize(("entries", "support"), [(60_000, 53 * math.log(2)), (2_000_000, 44.4)])
def test_exponential_variables_cover_the_float64_support(entries, support):
    """-log(1 - U) with 53-bit uniforms (torch, below NUMPY_MIN_ENTRIES) or the ziggurat (NumPy, above):
    non-negative, finite, within the source's support, and Exp(1) in the far tail."""
    sample = standard_exponential(torch.zeros(entries), torch.Generator().manual_seed(7)).numpy()
    assert sample.dtype == np.float64 and sample.min() >= 0 and sample.max() <= support
    for t in (5.0, 10.0):
        expected = len(sample) * math.exp(-t)  # P(E > t)
        assert abs(np.sum(sample > t) - expected) < 5 * math.sqrt(expected) + 1
    assert stats.kstest(sample[:100_000], stats.expon.cdf).pvalue > 1e-3


@pytest.mark.parametrize("sampler", [gaussian_noise, laplace_noise])
def test_both_float64_sources_are_keyed_by_the_torch_generator(sampler):
    """Below and above NUMPY_MIN_ENTRIES: the same seed gives the same draws, the generator advances (two
    calls differ), and the law is the documented one, in the tails too."""
    law = stats.norm(scale=1.3 * 0.5) if sampler is gaussian_noise else stats.laplace(scale=1.3)
    for entries in (NUMPY_MIN_ENTRIES - 1, NUMPY_MIN_ENTRIES, 4 * NUMPY_MIN_ENTRIES):
        generator = torch.Generator().manual_seed(8)
        first, second = (sampler(torch.zeros(entries), 1.3, 0.5, generator) for _ in range(2))
        assert torch.equal(first, sampler(torch.zeros(entries), 1.3, 0.5, torch.Generator().manual_seed(8)))
        assert not torch.equal(first, second)
        sample = torch.cat([first, second]).double().numpy()
        assert stats.kstest(sample, law.cdf).pvalue > 1e-3, entries
        expected = len(sample) * 2 * law.sf(4 * law.std())
        assert abs(np.sum(np.abs(sample) > 4 * law.std()) - expected) < 5 * math.sqrt(expected) + 1, entries
