"""The release objects the noisy sum hands its clipped sums to."""

import torch

from dpnoise.accounting.secure_noise import plan_discrete_gaussian
from dpnoise.mechanisms import get_mechanism
from dpnoise.mechanisms.release import FloatRelease, GridRelease


def test_float_release_adds_the_samplers_noise_share_or_none():
    sums = [torch.zeros(20_000, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64)]
    gaussian = get_mechanism("gaussian").sample_noise
    whole = FloatRelease(gaussian, 2.0, 0.5, torch.Generator().manual_seed(0))(sums)
    assert [r.shape for r in whole] == [s.shape for s in sums]
    assert abs(float(whole[0].std()) - 1.0) < 0.03  # sigma C = 2 x 0.5
    share = FloatRelease(gaussian, 2.0, 0.5, torch.Generator().manual_seed(0), shares=4)(sums)
    assert abs(float(share[0].std()) - 0.5) < 0.02  # one of 4 shares: std / sqrt(4)
    none = FloatRelease(gaussian, 2.0, 0.5, torch.Generator().manual_seed(0), shares=4, adds_share=False)(sums)
    assert all(torch.equal(r, s) for r, s in zip(none, sums))


def test_grid_release_gives_grid_multiples_near_the_sums():
    plan = plan_discrete_gaussian(1.0, 1.0, 1000)
    sums = [torch.full((1000,), 0.3, dtype=torch.float32)]
    released = GridRelease(plan)(sums)
    grid = plan.rounding.grid
    assert released[0].dtype == torch.float32 and released[0].shape == (1000,)
    assert torch.equal(released[0] / grid, torch.round(released[0] / grid))
    assert abs(float(released[0].double().mean()) - 0.3) < 0.2
