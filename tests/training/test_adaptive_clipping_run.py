"""Adaptive clipping (Andrew et al., arXiv 1905.03871): C_t follows a target quantile of the per-example gradient
norms through a noisy count; the noise follows C_t; the count is accounted with the gradient sum; C_t is
checkpointed."""

import copy
import json
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.cli.main import main
from dpnoise.mechanisms.clipping import AdaptiveClipping, updated_clip
from dpnoise.training import InvalidTrainingOptionError, PrivacyOptions, make_private
from dpnoise.training.errors import CheckpointMismatchError
from dpnoise.training.privacy_plan import resolve
from per_example_reference import single_example_gradients

NOISE = {"gaussian": {"noise_multiplier": 1e-9}, "lap2": {"laplace_scale": 1e-9}, "laplace-l1": {"laplace_scale": 1e-9}}


def rule(**changes) -> AdaptiveClipping:
    options = dict(initial_clip=2.0, target_quantile=0.5, learning_rate=0.2, count_noise=1e-12,
                   count_noise_law="gaussian", expected_batch_size=4.0, generator=torch.Generator().manual_seed(0))
    return AdaptiveClipping(**{**options, **changes})


def test_the_update_of_c_is_the_papers_on_a_hand_made_batch():
    clipping = rule()
    norms = torch.tensor([0.5, 1.5, 2.0, 3.0], dtype=torch.float64)
    factors = clipping(norms)  # clipped to C_t = 2, scaled by C_0 / C_t = 1
    torch.testing.assert_close(factors, torch.clamp(2.0 / (norms + 1e-6), max=1.0))
    released = clipping.release([torch.ones(3)])
    torch.testing.assert_close(released[0], torch.ones(3))
    assert clipping.clip == pytest.approx(2.0 * math.exp(-0.2 * (3 / 4 - 0.5)), rel=1e-9)  # 3 of 4 below C
    assert updated_clip(1.0, 0.2, 0.5, 0.2) == pytest.approx(math.exp(0.06))
    # the next step clips to C_1 and its release is rescaled to it: contributions are at most C_0 before
    c1 = clipping.clip
    factors = clipping(norms)
    assert torch.all(factors * norms <= 2.0) and clipping.count.item() == 2  # 0.5 and 1.5 <= C_1 ~ 1.90 < 2
    assert clipping.release([torch.ones(1)])[0].item() == pytest.approx(c1 / 2.0)


def test_the_count_noise_comes_from_the_runs_generator():
    noisy = [rule(count_noise=3.0, generator=torch.Generator().manual_seed(seed)) for seed in (1, 1, 2)]
    for clipping in noisy:
        clipping(torch.tensor([0.5, 3.0]))
        clipping.release([torch.zeros(1)])
    assert noisy[0].clip == noisy[1].clip != noisy[2].clip


def architecture() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def make_run(mechanism="gaussian", grad_sample_mode="bookkeeping", **options):
    torch.manual_seed(0)
    model = architecture()
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), DataLoader(data, batch_size=16),
                                   mechanism=mechanism, delta=1e-5, max_grad_norm=0.7, clipping="adaptive", seed=0,
                                   noise_seed=0, grad_sample_mode=grad_sample_mode,
                                   **{**NOISE[mechanism], **options})


@pytest.mark.parametrize("mechanism", sorted(NOISE))
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_each_step_is_the_sum_clipped_to_c_t(mechanism, grad_sample_mode):
    model, (module, optimizer, loader) = make_run(mechanism, grad_sample_mode, quantile_noise=1e-9)
    engine = optimizer.privacy_engine
    assert engine.adaptive_clipping.generator is engine.noise_generator
    batches = iter(loader)
    for _ in range(3):
        reference, clip = architecture(), engine.adaptive_clipping.clip
        reference.load_state_dict(copy.deepcopy(model.state_dict()))
        x, y = next(batches)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
        grads = single_example_gradients(reference, x, y)
        norms = torch.cat([g.reshape(len(x), -1) for g in grads], dim=1).norm(1 if mechanism == "laplace-l1" else 2, dim=1)
        factors = torch.clamp(clip / (norms + 1e-6), max=1.0)
        for old, new, g in zip(before, model.parameters(), grads):
            torch.testing.assert_close(old - new, torch.einsum("i,i...->...", factors, g) / 16, rtol=1e-4, atol=1e-6)
        below = int((norms <= clip).sum())
        assert engine.adaptive_clipping.clip == pytest.approx(clip * math.exp(-0.2 * (below / 16 - 0.5)), rel=1e-6)


def test_c_follows_the_quantile_of_known_norms():
    clipping = rule(initial_clip=1.0, target_quantile=0.9, count_noise=5.0, expected_batch_size=256.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(400):  # norms |N(0, 1)| * 3: the 0.9-quantile is 3 * 1.6449
        clipping(torch.randn(256, generator=generator).abs() * 3)
        clipping.release([torch.zeros(1)])
    assert clipping.clip == pytest.approx(3 * 1.6449, rel=0.1)


def test_the_epsilon_covers_the_count_and_the_report_separates_it():
    _, (module, optimizer, loader) = make_run(noise_multiplier=1.0, quantile_noise=2.0)
    engine = optimizer.privacy_engine
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    report = engine.adaptive_clipping_report()
    assert engine.get_epsilon() > report["epsilon_without_count"] > 0 and report["epsilon_of_count"] > 0
    assert report["final_clip"] == engine.adaptive_clipping.clip


def test_a_resumed_run_keeps_c_and_a_checkpoint_without_it_is_refused():
    _, (module, optimizer, loader) = make_run(noise_multiplier=1.0)
    engine = optimizer.privacy_engine
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x), y).backward()
        optimizer.step()
    state = engine.state_dict()
    assert state["adaptive_clip"] == engine.adaptive_clipping.clip != 0.7
    _, (_, resumed_optimizer, _) = make_run(noise_multiplier=1.0)
    resumed = resumed_optimizer.privacy_engine
    resumed.load_state_dict(state)
    assert resumed.adaptive_clipping.clip == state["adaptive_clip"]
    del state["adaptive_clip"]
    with pytest.raises(CheckpointMismatchError, match="adaptive_clip"):
        resumed.load_state_dict(state)


def test_the_options_are_checked_by_name():
    base = dict(mechanism="gaussian", delta=1e-5, noise=1.0)
    for bad, name in [({"target_quantile": 0.0}, "target_quantile"), ({"target_quantile": 1.5}, "target_quantile"),
                      ({"clipping_lr": -0.1}, "clipping_lr"), ({"quantile_noise": -1.0}, "quantile_noise")]:
        with pytest.raises(InvalidTrainingOptionError, match=name):
            PrivacyOptions(**base, clipping="adaptive", **bad)
    with pytest.raises(InvalidTrainingOptionError, match="clipping_lr applies to clipping adaptive only"):
        PrivacyOptions(**base, clipping_lr=0.1)
    with pytest.raises(InvalidTrainingOptionError, match="quantile_noise_law laplace applies to the Laplace"):
        PrivacyOptions(**base, clipping="adaptive", quantile_noise_law="laplace")
    adaptive = PrivacyOptions(**base, clipping="adaptive")
    assert (adaptive.target_quantile, adaptive.clipping_lr, adaptive.quantile_noise_law) == (0.5, 0.2, "gaussian")
    plan = resolve(adaptive, sample_rate=0.01, params=100, expected_batch_size=300)
    assert plan.setup.quantile_noise == 15.0  # Andrew et al.: expected batch / 20
    with pytest.raises(InvalidTrainingOptionError, match="quantile_noise"):
        resolve(adaptive, sample_rate=0.01, params=100)


def test_dpnoise_train_adaptive_on_digits_prints_epsilon(capsys):
    assert main(["train", "--dataset", "digits", "--model", "cnn", "--delta", "1e-5", "--batch-size", "64",
                 "--threads", "1", "--no-progress", "--seed", "0", "--noise-seed", "0", "--mechanism", "gaussian",
                 "--clipping", "adaptive", "--target-quantile", "0.7", "--quantile-noise", "4", "--epsilon", "3",
                 "--epochs", "1", "--max-steps", "3", "--lr", "1e-2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 3 and 0 < report["epsilon"] <= 3
    adaptive = report["adaptive_clipping"]
    assert adaptive["epsilon_without_count"] < report["epsilon"] and adaptive["final_clip"] > 0
