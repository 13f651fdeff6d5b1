"""Per-example clipping: norms <= C (L2 and exact L1), per-sample gradients vs a one-at-a-time reference."""

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.nn import functional as F

from dpnoise.mechanisms import clip_factors, clipped_sum, per_example_norms

from per_example_reference import single_example_gradients


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    )


def per_sample_gradients(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    wrapped = GradSampleModule(module, loss_reduction="sum")
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    return [p.grad_sample for p in wrapped.parameters()]


def test_per_sample_gradients_match_one_at_a_time_reference():
    x, y = torch.randn(7, 1, 8, 8), torch.randint(0, 5, (7,))
    module = tiny_cnn()
    expected = single_example_gradients(module, x, y)
    actual = per_sample_gradients(module, x, y)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("norm_ord", [1, 2])
@pytest.mark.parametrize("clip", [1e-3, 0.1, 10.0])
def test_clipped_per_example_norms_at_most_clip(norm_ord, clip):
    x, y = torch.randn(16, 1, 8, 8) * 3, torch.randint(0, 5, (16,))
    grads = per_sample_gradients(tiny_cnn(), x, y)
    factors = clip_factors(per_example_norms(grads, norm_ord), clip)
    clipped = [g * factors.view(-1, *([1] * (g.dim() - 1))) for g in grads]
    norms = per_example_norms(clipped, norm_ord)
    assert torch.all(norms <= clip * (1 + 1e-5))
    # examples already inside the ball are untouched
    raw = per_example_norms(grads, norm_ord)
    inside = raw < clip * 0.99
    torch.testing.assert_close(norms[inside], raw[inside])


def test_per_example_norms_are_exact_l1_and_l2_over_all_parameters():
    grads = [torch.randn(3, 4, 5), torch.randn(3, 2)]
    flat = torch.cat([g.reshape(3, -1) for g in grads], dim=1)
    torch.testing.assert_close(per_example_norms(grads, 1), flat.abs().sum(dim=1))
    torch.testing.assert_close(per_example_norms(grads, 2), flat.norm(dim=1))
    with pytest.raises(ValueError, match="norm_ord"):
        per_example_norms(grads, 3)


def test_clipped_sum_weights_each_example():
    grad_sample = torch.randn(4, 3, 2)
    factors = torch.tensor([1.0, 0.5, 0.0, 2.0])
    expected = (grad_sample * factors.view(4, 1, 1)).sum(dim=0)
    torch.testing.assert_close(clipped_sum(grad_sample, factors), expected)
