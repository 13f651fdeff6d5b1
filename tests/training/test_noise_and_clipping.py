"""The optimizer clips per example in the mechanism's norm and adds noise in the documented units."""

import pytest
import torch
from opacus import GradSampleModule
from scipy import stats
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from dpnoise.accounting import noise_keywords
from dpnoise.mechanisms import get_mechanism, per_example_norms
from dpnoise.mechanisms.release import FloatRelease
from dpnoise.training import BookkeepingModule, NoisyGradientOptimizer, make_private

from per_example_reference import single_example_gradients
from training_helpers import digits_loader, mlp


class AlwaysAdmit:
    """A stand-in privacy engine that admits every step and counts them."""

    def __init__(self):
        self.steps = 0

    def admit_step(self) -> bool:
        return True

    def record_step(self) -> None:
        self.steps += 1


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "bookkeeping"])
@pytest.mark.parametrize("mechanism", ["lap2", "laplace-l1", "gaussian"])
def test_optimizer_sums_per_example_clipped_gradients(mechanism, grad_sample_mode):
    mech = get_mechanism(mechanism)
    torch.manual_seed(1)
    x, y = torch.randn(12, 1, 8, 8) * 4, torch.randint(0, 10, (12,))
    model, clip = mlp(hidden=16), 0.5
    per_param = single_example_gradients(model, x, y)
    norms = per_example_norms(per_param, mech.clip_norm_ord)
    assert (norms > clip).any(), "the test needs examples outside the clipping ball"
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    expected = [(g * factors.view(-1, *[1] * (g.dim() - 1))).sum(0) for g in per_param]

    if grad_sample_mode == "hooks":
        wrapped, bookkeeping = GradSampleModule(model, loss_reduction="mean"), None
    else:
        wrapped = bookkeeping = BookkeepingModule(model)
    gate = AlwaysAdmit()
    optimizer = NoisyGradientOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.0), mechanism=mech,
        release=FloatRelease(mech.sample_noise, 0.0, clip, None), max_grad_norm=clip,
        expected_batch_size=12, gate=gate, bookkeeping=bookkeeping,
    )
    F.cross_entropy(wrapped(x), y).backward()
    optimizer.step()
    for p, e in zip(wrapped.parameters(), expected):
        torch.testing.assert_close(p.grad * 12, e, rtol=1e-4, atol=1e-6)
    assert gate.steps == 1


def one_zero_gradient_step(mechanism: str, noise: float, clip: float) -> torch.Tensor:
    """Noise added by one step when every per-example gradient is zero (times the batch size)."""
    dataset = TensorDataset(torch.zeros(500, 20), torch.zeros(500, dtype=torch.long))
    model = nn.Linear(20, 400)  # 8400 noise coordinates
    module, optimizer, loader = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.0), digits_loader(dataset, 50),
        mechanism=mechanism, **noise_keywords(mechanism, noise), max_grad_norm=clip, delta=1e-5, seed=3,
        noise_seed=3,  # a fixed draw: the distribution tests below are then not flaky
    )
    inputs, _ = next(iter(loader))
    optimizer.zero_grad()
    (module(inputs).sum() * 0.0).backward()
    optimizer.step()
    return torch.cat([p.grad.flatten() for p in module.parameters()]) * optimizer.expected_batch_size


@pytest.mark.parametrize("mechanism", ["lap2", "laplace-l1"])
def test_zero_gradient_noise_is_laplace_with_absolute_scale(mechanism):
    sample = one_zero_gradient_step(mechanism, noise=0.7, clip=3.0).numpy()
    assert stats.kstest(sample, stats.laplace(scale=0.7).cdf).pvalue > 1e-3
    assert stats.kstest(sample, stats.norm(scale=sample.std()).cdf).pvalue < 1e-3  # not Gaussian


def test_zero_gradient_noise_is_gaussian_with_std_sigma_times_clip():
    sample = one_zero_gradient_step("gaussian", noise=1.5, clip=2.0).numpy()
    assert stats.kstest(sample, stats.norm(scale=3.0).cdf).pvalue > 1e-3
