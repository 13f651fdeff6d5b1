"""Automatic clipping (Bu et al., arXiv 2206.07136): every example's gradient scaled by C / (||g|| + gamma),
its norm below C, the same accounting; the step's sum equals the per-example reference."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.mechanisms.clipping import automatic_clip_factors, clipping_rule
from dpnoise.training import InvalidTrainingOptionError, PrivacyOptions, make_private
from per_example_reference import single_example_gradients


def test_every_scaled_norm_is_below_c_and_none_is_left_unscaled():
    norms = torch.tensor([0.0, 1e-8, 0.005, 0.3, 1.0, 50.0, 1e12], dtype=torch.float64)
    factors = automatic_clip_factors(norms, 0.5, 0.01)
    assert torch.all(factors * norms < 0.5) and torch.all(factors > 0)
    torch.testing.assert_close(factors, 0.5 / (norms + 0.01))
    with pytest.raises(ValueError, match="gamma"):
        clipping_rule("automatic", 1.0, 0.0)


@pytest.mark.parametrize("mechanism,noise", [("gaussian", {"noise_multiplier": 1e-9}), ("lap2", {"laplace_scale": 1e-9}),
                                             ("laplace-l1", {"laplace_scale": 1e-9})])
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_the_step_is_the_automatically_clipped_sum(mechanism, noise, grad_sample_mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    reference = copy.deepcopy(model)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                                 DataLoader(data, batch_size=16), mechanism=mechanism, delta=1e-5,
                                                 max_grad_norm=0.7, clipping="automatic", clipping_gamma=0.05, seed=0,
                                                 noise_seed=0, grad_sample_mode=grad_sample_mode, **noise)
    x, y = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()
    grads = single_example_gradients(reference, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in grads], dim=1)
    norms = flat.norm(1 if mechanism == "laplace-l1" else 2, dim=1)
    factors = 0.7 / (norms + 0.05)
    for old, new, g in zip(before, model.parameters(), grads):
        expected = torch.einsum("i,i...->...", factors, g) / (0.25 * 64)  # the expected batch q N
        torch.testing.assert_close(old - new, expected, rtol=1e-4, atol=1e-6)


def test_the_epsilon_is_the_flat_clippings_and_the_options_are_checked():
    flat = PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0)
    auto = PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, clipping="automatic")
    assert auto.clipping_gamma == 0.01 and flat.clipping_gamma is None
    with pytest.raises(InvalidTrainingOptionError, match="automatic applies to the gradient mechanisms"):
        PrivacyOptions(mechanism="dirichlet", delta=1e-5, noise=0.5, clipping="automatic")
    with pytest.raises(InvalidTrainingOptionError, match="clipping_gamma applies to clipping automatic only"):
        PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, clipping_gamma=0.1)
    with pytest.raises(InvalidTrainingOptionError, match="clipping must be one of flat, automatic"):
        PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, clipping="hard")
    from dpnoise.training.privacy_plan import resolve

    plans = [resolve(options, sample_rate=0.01, params=100) for options in (flat, auto)]
    assert plans[0].step_event == plans[1].step_event and plans[1].setup.clipping == "automatic"
