"""Dirichlet output mechanism: draw mean, stable log-probabilities, gradient = kappa * CE gradient."""

import math

import pytest
import torch
from torch.nn import functional as F

from dpnoise.mechanisms import DirichletOutput, dirichlet_learning_rate, dirichlet_log_sample, dirichlet_nll, kappa


def test_draw_mean_matches_normalised_concentration():
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]]).expand(40_000, 4)
    r, alpha = 3.0, 0.5
    draws = dirichlet_log_sample(logits, r, alpha, torch.Generator().manual_seed(0)).exp()
    concentration = r * torch.softmax(logits[0], dim=0) + alpha
    expected = concentration / concentration.sum()
    # standard error of each coordinate is below 0.003 here
    torch.testing.assert_close(draws.mean(dim=0), expected, atol=0.01, rtol=0)
    torch.testing.assert_close(draws.sum(dim=1), torch.ones(40_000), atol=1e-5, rtol=0)


def test_log_probabilities_finite_for_tiny_concentrations():
    logits = torch.randn(256, 10, requires_grad=True)
    log_p = dirichlet_log_sample(logits, 1e-3, 1e-3, torch.Generator().manual_seed(1))
    assert torch.isfinite(log_p).all()
    F.nll_loss(log_p, torch.zeros(256, dtype=torch.long)).backward()
    assert torch.isfinite(logits.grad).all()


def test_expected_gradient_is_kappa_times_cross_entropy_gradient():
    # docs/theory/dirichlet.md §4: d/dz E[-log p~_y] = kappa(s_y) (s - e_y)
    r, alpha, n = 0.5, 1.0, 200_000
    z = torch.tensor([1.0, -0.5, 0.2])
    logits = z.expand(n, 3).clone().requires_grad_(True)
    y = torch.zeros(n, dtype=torch.long)
    dirichlet_nll(logits, y, r, alpha, torch.Generator().manual_seed(2)).backward()
    mean_gradient = logits.grad.sum(dim=0)  # mean loss: rows carry 1/n each
    s = torch.softmax(z, dim=0)
    expected = kappa(s[0].item(), r, alpha) * (s - F.one_hot(torch.tensor(0), 3))
    torch.testing.assert_close(mean_gradient, expected.float(), atol=4e-3, rtol=0)


def test_kappa_values_and_effective_learning_rate():
    # docs/theory/dirichlet.md §4: alpha = 1, r = 0.5: kappa(0.1) = 0.077, kappa(0.9) = 0.44
    assert kappa(0.1, 0.5, 1.0) == pytest.approx(0.077, abs=1e-3)
    assert kappa(0.9, 0.5, 1.0) == pytest.approx(0.44, abs=1e-2)
    lr = dirichlet_learning_rate(0.01, 0.5, 1.0)
    assert lr * kappa(0.9, 0.5, 1.0) == pytest.approx(0.01)
    # r -> infinity: kappa -> 1
    assert kappa(0.9, 1e6, 1.0) == pytest.approx(1.0, rel=1e-3)


def test_wrapper_is_private_in_training_and_plain_in_eval():
    module = torch.nn.Linear(4, 3)
    wrapped = DirichletOutput(module, r=0.5, alpha=1.0, generator=torch.Generator().manual_seed(3))
    x = torch.randn(5, 4)
    train_out = wrapped(x)
    torch.testing.assert_close(train_out.exp().sum(dim=1), torch.ones(5))
    # cross_entropy on log p~ equals the NLL of p~ (log_softmax leaves it unchanged)
    y = torch.tensor([0, 1, 2, 0, 1])
    torch.testing.assert_close(F.cross_entropy(train_out, y), F.nll_loss(train_out, y))
    wrapped.eval()
    torch.testing.assert_close(wrapped(x), torch.log_softmax(module(x), dim=1))
    with pytest.raises(ValueError, match="alpha"):
        DirichletOutput(module, r=0.5, alpha=0.0)
    assert math.isfinite(kappa(0.9, 0.5, 1.0))
