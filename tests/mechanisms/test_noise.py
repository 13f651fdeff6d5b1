"""Noise samplers: the right distribution in the documented units."""

import numpy as np
import torch
from scipy import stats

from dpnoise.mechanisms import gaussian_noise, laplace_noise


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
