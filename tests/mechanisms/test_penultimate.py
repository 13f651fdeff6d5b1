"""Penultimate-layer Gaussian: activations clipped per example, N(0, sigma^2 C^2) noise, eval untouched."""

import pytest
import torch
from scipy import stats
from torch import nn

from dpnoise.mechanisms import PenultimateGaussian
from dpnoise.mechanisms.penultimate import clip_and_noise_rows


def test_rows_clipped_then_noised_with_sigma_times_clip():
    activations = torch.randn(4000, 8) * 10
    tiny = clip_and_noise_rows(activations, 1e-9, 0.5, torch.Generator().manual_seed(0))
    assert torch.all(tiny.norm(dim=1) <= 0.5 + 1e-5)
    zero = clip_and_noise_rows(torch.zeros(4000, 8), 2.0, 0.5, torch.Generator().manual_seed(1))
    assert stats.kstest(zero.flatten().numpy(), stats.norm(scale=1.0).cdf).pvalue > 1e-3


def test_wrapper_noises_the_output_layer_input_only_in_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    wrapped = PenultimateGaussian(model, sigma=1.0, clip=1.0, generator=torch.Generator().manual_seed(2))
    assert wrapped.layer_name == "2"
    x = torch.randn(10, 3)
    assert not torch.allclose(wrapped(x), model[2](model[1](model[0](x))))
    wrapped.eval()
    torch.testing.assert_close(wrapped(x), model(x))


def test_model_without_linear_layer_is_refused():
    with pytest.raises(ValueError, match="nn.Linear"):
        PenultimateGaussian(nn.Conv2d(1, 1, 1), sigma=1.0, clip=1.0)
