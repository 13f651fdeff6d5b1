"""Step provenance: a step is noised and accounted only for a batch the private loader drew
(dpnoise.training.provenance); anything else is refused before any noise, and the ledger is untouched."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import make_private
from dpnoise.training.errors import ForeignBatchError
from dpnoise.training.provenance import BatchProvenance, DrawnBatch, holds

MECHANISMS = {"gaussian": {"noise_multiplier": 1.0}, "dirichlet": {"concentration": 0.5}}


def data(n: int = 1000) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator))


def private(mechanism: str = "gaussian", batch_size: int = 10, grad_sample_mode: str = "auto", num_workers: int = 0,
            **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    extra = {} if mechanism == "dirichlet" else {"grad_sample_mode": grad_sample_mode}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module, optimizer, loader = make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data(), batch_size=batch_size, num_workers=num_workers),
            mechanism=mechanism, delta=1e-5, **MECHANISMS[mechanism], **extra, **options)
    return model, module, optimizer, loader


def step(module, optimizer, inputs, targets) -> None:
    optimizer.zero_grad()
    F.cross_entropy(module(inputs), targets).backward()
    optimizer.step()


def unchanged(model, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_a_batch_of_the_users_own_loader_is_refused_before_any_noise(mechanism, grad_sample_mode):
    # q = 0.01 from make_private, then a step on a shuffled loader of 500: it was accounted at q = 0.01.
    model, module, optimizer, _ = private(mechanism, grad_sample_mode=grad_sample_mode)
    engine = optimizer.privacy_engine
    before = [p.detach().clone() for p in model.parameters()]
    inputs, targets = next(iter(DataLoader(data(), batch_size=500, shuffle=True)))
    with pytest.raises(ForeignBatchError, match="not a batch of the private loader.*Fix: train on the batches of "
                                                "the loader make_private returned"):
        step(module, optimizer, inputs, targets)
    assert engine.steps == 0 and all(acc.steps == 0 for acc in engine.accountants.values())
    assert unchanged(model, before)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_private_loaders_batches_step_also_moved_and_cast(mechanism):
    _, module, optimizer, loader = private(mechanism)
    batches = iter(loader)
    inputs, targets = next(batches)
    step(module, optimizer, inputs, targets)
    inputs, targets = next(batches)
    step(module, optimizer, inputs.double().float().clone(), targets)  # a framework's copy: same values
    inputs, targets = next(batches)
    step(module, optimizer, inputs.view(len(inputs), 2, 3).reshape(len(inputs), 6), targets)  # a view
    assert optimizer.privacy_engine.steps == 3


def test_inputs_computed_in_the_loop_are_refused_unless_declared():
    _, module, optimizer, loader = private()
    engine = optimizer.privacy_engine
    batches = iter(loader)
    inputs, targets = next(batches)
    with pytest.raises(ForeignBatchError, match="inputs computed in the loop"):
        step(module, optimizer, inputs * 2.0, targets)
    inputs, targets = next(batches)
    step(module, optimizer, engine.derived(inputs, inputs * 2.0), targets)
    assert engine.steps == 1
    with pytest.raises(ForeignBatchError, match="source tensor is not in a batch"):
        engine.derived(torch.randn(3, 6), torch.randn(3, 6))


def test_a_draw_is_released_once():
    _, module, optimizer, loader = private()
    inputs, targets = next(iter(loader))
    step(module, optimizer, inputs, targets)
    with pytest.raises(ForeignBatchError, match="not a batch of the private loader"):
        step(module, optimizer, inputs, targets)  # taken: no longer pending
    assert optimizer.privacy_engine.steps == 1


def test_a_step_without_a_forward_pass_or_after_two_is_refused():
    _, module, optimizer, loader = private()
    engine = optimizer.privacy_engine
    batches = iter(loader)
    inputs, targets = next(batches)
    with pytest.raises(ForeignBatchError, match="without a training forward pass"):
        optimizer.step()
    optimizer.zero_grad()
    module(inputs)  # a training-mode pass for logging, then the training pass
    F.cross_entropy(module(inputs), targets).backward()
    with pytest.raises(ForeignBatchError, match="after 2 training forward passes"):
        optimizer.step()
    inputs, targets = next(batches)
    with torch.no_grad():  # evaluation passes do not count
        module(torch.randn(5, 6))
    step(module, optimizer, inputs, targets)
    assert engine.steps == 1


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_pieces_of_a_draw_make_one_step_in_order(mechanism):
    _, module, optimizer, loader = private(mechanism, batch_size=40, max_physical_batch_size=8)
    engine = optimizer.privacy_engine
    pieces = []
    for batch in loader:
        pieces.append(batch)
        if engine.batch_provenance.pending[-1].ends_logical_batch and len(pieces) >= 3:
            break
    step(module, optimizer, *pieces[0])
    with pytest.raises(ForeignBatchError, match="piece 3 of .* while piece 1 of .* was the last piece taken"):
        step(module, optimizer, *pieces[2])  # piece 2 dropped (a wrapper re-dealt the pieces)
    assert engine.steps == 0


def test_an_earlier_draw_padding_a_share_is_refused():
    # What accelerate's even_batches does to the shorter rank: yield one of its earlier draws again.
    provenance = BatchProvenance()
    first = provenance.register((torch.ones(2, 1),), DrawnBatch([0, 1], draw=0, piece=0, pieces=1))
    provenance.forwards.append(first)
    assert provenance.take() is first
    again = provenance.register((torch.ones(2, 1),), DrawnBatch([0, 1], draw=0, piece=0, pieces=1))
    provenance.forwards.append(again)
    with pytest.raises(ForeignBatchError, match="Poisson draw 0, a Poisson draw that was already released"):
        provenance.take()


def test_workers_keep_the_provenance():
    _, module, optimizer, loader = private(batch_size=50, num_workers=2)
    batches = iter(loader)
    for _ in range(3):
        step(module, optimizer, *next(batches))
    assert optimizer.privacy_engine.steps == 3


def test_holds_recognises_the_same_values_only():
    x = torch.arange(12.0).view(4, 3)
    assert holds(x, x) and holds(x, x[:, :2]) and holds(x, x.clone()) and holds(x, x.double())
    assert not holds(x, x + 1) and not holds(x, x[:2].clone()) and not holds(x, torch.zeros(()))
