"""Logical batches in physical batches (``make_private(max_physical_batch_size=...)``).

A Poisson batch split into physical batches must give the step one pass over it gives: the same
clipped sum, noised once, one accounted step.  Plain gradient accumulation (two backward passes
without a step) stays refused.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.accounting import noise_keywords
from dpnoise.mechanisms import dirichlet, penultimate
from dpnoise.training import make_private, train_steps
from dpnoise.training.errors import InvalidTrainingOptionError, PrivacyBudgetExceededError
from dpnoise.training.sampling import LogicalBatchTracker, PoissonShardSampler

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

NOISE = {"gaussian": 1.0, "lap2": 0.05, "laplace-l1": 0.05, "dirichlet": 20.0, "penultimate-gaussian": 1.0}


def data(n: int = 300) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 12, generator=generator), torch.randint(0, 4, (n,), generator=generator))


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train(mechanism: str, physical: int | None, grad_sample_mode: str = "auto", steps: int = 4, **options):
    """Parameters after ``steps`` steps of the usual loop, the engine, and the number of batches seen."""
    net = model()
    extra = {} if mechanism in ("dirichlet",) else {"grad_sample_mode": grad_sample_mode}
    module, optimizer, loader = make_private(
        net, torch.optim.SGD(net.parameters(), lr=0.5), DataLoader(data(), batch_size=60), mechanism=mechanism,
        **noise_keywords(mechanism, NOISE[mechanism]), max_grad_norm=0.5, delta=1e-5, seed=3, noise_seed=3,
        max_physical_batch_size=physical, **extra, **options)
    engine, batches = optimizer.privacy_engine, 0
    for inputs, targets in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(inputs), targets).backward()
        optimizer.step()
        batches += 1
        if engine.steps == steps:
            break
    return [p.detach().clone() for p in net.parameters()], engine, batches


@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "laplace-l1"])
def test_physical_batches_give_the_step_of_the_logical_batch(mechanism, grad_sample_mode):
    whole, engine_whole, batches_whole = train(mechanism, None, grad_sample_mode)
    split, engine_split, batches_split = train(mechanism, 7, grad_sample_mode)
    assert batches_whole == 4 and batches_split > 4 * 5  # about 60 examples per step, 7 per physical batch
    assert engine_split.steps == engine_whole.steps == 4
    assert engine_split.get_epsilon() == engine_whole.get_epsilon()
    # same Poisson draws, same clipped sum, the same noise drawn once per step: equal up to rounding
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mechanism", ["dirichlet", "penultimate-gaussian"])
def test_output_mechanisms_average_the_gradient_over_the_logical_batch(mechanism, monkeypatch):
    # Deterministic outputs (test hooks): the per-example draws would otherwise depend on how the
    # generator's stream is cut into batches.
    monkeypatch.setattr(dirichlet, "log_gamma_rsample", lambda concentration, generator: concentration.log())
    monkeypatch.setattr(penultimate, "gaussian_noise", lambda reference, *args: torch.zeros_like(reference))
    whole, _, _ = train(mechanism, None)
    split, engine, batches = train(mechanism, 9)
    assert engine.steps == 4 and batches > 4 * 4
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_plain_gradient_accumulation_stays_refused(grad_sample_mode):
    net = model()
    module, optimizer, loader = make_private(
        net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data(), batch_size=60), mechanism="gaussian",
        noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, seed=0, noise_seed=0, grad_sample_mode=grad_sample_mode,
        max_physical_batch_size=1000)
    inputs, targets = next(iter(loader))
    optimizer.zero_grad()
    with pytest.raises((RuntimeError, ValueError), match="accumulat"):
        for _ in range(2):
            torch.nn.functional.cross_entropy(module(inputs), targets).backward()
        optimizer.step()


def test_sampler_splits_every_logical_batch_and_flags_its_end():
    tracker = LogicalBatchTracker()
    generator = torch.Generator().manual_seed(0)
    sampler = PoissonShardSampler(torch.arange(100), 0.3, generator, steps=20, max_physical_batch_size=8,
                                  tracker=tracker)
    logical, current = [], []
    for batch in sampler:
        assert tracker.advance() is batch and len(batch) <= 8
        current += batch
        if batch.ends_logical_batch:
            logical.append(current)
            current = []
    assert current == [] and len(logical) == 20
    reference = PoissonShardSampler(torch.arange(100), 0.3, torch.Generator().manual_seed(0), steps=20)
    assert logical == list(reference)  # the same draws, only cut into pieces


def test_an_empty_logical_batch_is_one_empty_physical_batch():
    tracker = LogicalBatchTracker()
    sampler = PoissonShardSampler(torch.arange(5), 1e-9, torch.Generator().manual_seed(0), steps=3,
                                  max_physical_batch_size=2, tracker=tracker)
    assert list(sampler) == [[], [], []]
    assert [(b.ends_logical_batch, b.size, b.draw) for b in tracker.queued] == [(True, 0, 0), (True, 0, 1), (True, 0, 2)]


def test_budget_stop_after_accumulated_physical_batches_leaves_nothing_behind():
    # Fixed noise with a target that allows 2 steps: the third logical batch is refused.
    net = model()
    module, optimizer, loader = make_private(
        net, torch.optim.SGD(net.parameters(), lr=0.5), DataLoader(data(), batch_size=60), mechanism="gaussian",
        noise_multiplier=2.0, target_epsilon=0.9, max_grad_norm=0.5, delta=1e-5, seed=3, noise_seed=3,
        on_budget_exhausted="stop", max_physical_batch_size=13)
    engine = optimizer.privacy_engine
    history = train_steps(module, optimizer, iter(loader), engine, 10)
    assert engine.budget_exhausted and len(history) == engine.max_steps == engine.steps
    optimizer.zero_grad()
    assert optimizer.noisy_sum.sums is None


def test_a_step_refused_by_raising_leaves_no_clipped_sum_behind():
    """The refused logical batch's clipped sum must not reach a later step (it would then carry two
    Poisson batches under the noise of one)."""
    net = model()
    module, optimizer, loader = make_private(
        net, torch.optim.SGD(net.parameters(), lr=0.5), DataLoader(data(), batch_size=60), mechanism="gaussian",
        noise_multiplier=2.0, target_epsilon=0.9, max_grad_norm=0.5, delta=1e-5, seed=3, noise_seed=3,
        max_physical_batch_size=13)
    engine = optimizer.privacy_engine
    with pytest.raises(PrivacyBudgetExceededError):
        train_steps(module, optimizer, iter(loader), engine, 10)
    assert engine.steps == engine.max_steps and optimizer.noisy_sum.sums is None


def test_train_steps_reports_logical_batches():
    net = model()
    module, optimizer, loader = make_private(
        net, torch.optim.SGD(net.parameters(), lr=0.5), DataLoader(data(), batch_size=60), mechanism="lap2",
        laplace_scale=0.05, max_grad_norm=0.5, delta=1e-5, seed=3, noise_seed=3, max_physical_batch_size=11)
    history = train_steps(module, optimizer, iter(loader), optimizer.privacy_engine, 3)
    assert [m.step for m in history] == [1, 2, 3]
    assert all(m.batch_size > 11 for m in history)  # whole logical batches of about 60


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_physical_batch_size_is_refused_by_name(value):
    net = model()
    with pytest.raises(Exception, match="max_physical_batch_size"):
        make_private(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data(), batch_size=60),
                     mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, max_physical_batch_size=value)


def test_physical_batches_need_poisson_sampling():
    net = model()
    with pytest.raises(InvalidTrainingOptionError, match="poisson_sampling"):
        make_private(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(data(), batch_size=60),
                     mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, max_physical_batch_size=8,
                     poisson_sampling=False)


@pytest.mark.parametrize("physical", [None, 7])
@pytest.mark.parametrize("sample_rate", [0.003, 0.05])  # many empty batches, then none
def test_tensor_datasets_read_a_batch_at_a_time_give_the_same_batches(physical, sample_rate):
    from torch.utils.data import Dataset
    from torch.utils.data._utils.collate import default_collate

    from dpnoise.training.sampling import poisson_loader

    tensors = data(500)

    class OneByOne(Dataset):  # the generic path: per-example reads, collated
        def __len__(self):
            return len(tensors)

        def __getitem__(self, i):
            return tensors[i]

    seen = []
    for dataset in (tensors, OneByOne()):
        tracker = LogicalBatchTracker()
        loader = poisson_loader(dataset, sample_rate=sample_rate, shard=torch.arange(500),
                                generator=torch.Generator().manual_seed(1), device=torch.device("cpu"),
                                float_dtype=torch.float32, collate_fn=default_collate,
                                max_physical_batch_size=physical, tracker=tracker)
        seen.append([(x, y, tracker.last.ends_logical_batch) for x, y in loader])
    fast, generic = seen
    assert len(fast) == len(generic) >= 20
    for (x, y, ends), (x_ref, y_ref, ends_ref) in zip(fast, generic):
        assert ends == ends_ref and x.shape == x_ref.shape and x.dtype == x_ref.dtype and y.dtype == y_ref.dtype
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
