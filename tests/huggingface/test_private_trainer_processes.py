"""The private Trainer on 2 gloo processes started as ``torchrun`` would (``trainer_worker.py``): each process
draws its own shard of every Poisson batch, and every step's update is the exact one of the union batch
(computed here by plain autograd, example by example; noise switched off), with one process's epsilon."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the launch helpers

import trainer_worker as worker  # noqa: E402
from training_helpers import finish, launch  # noqa: E402

WORKER = Path(__file__).with_name("trainer_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("trainer")
    for code, _, err in finish(launch([str(WORKER), str(out)]), timeout=170):
        assert code == 0, err[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def exact_training(steps: list[list[int]]) -> dict[str, torch.Tensor]:
    """The tiny BERT after SGD steps on the exact clipped sums of ``steps`` (each example's gradient clipped)."""
    model, data = worker.tiny_bert(), worker.Sentences()
    params = list(model.parameters())
    for indices in steps:
        total = [torch.zeros_like(p) for p in params]
        for i in indices:
            example = {name: value.unsqueeze(0) for name, value in data[i].items()}
            grads = torch.autograd.grad(model(**example).loss, params)
            factor = min(1.0, worker.CLIP / (torch.sqrt(sum(g.pow(2).sum() for g in grads)).item() + 1e-6))
            total = [t + factor * g for t, g in zip(total, grads)]
        with torch.no_grad():
            for p, summed in zip(params, total):
                p -= worker.LR * summed / worker.BATCH
    return {name: p.detach() for name, p in model.named_parameters()}


def test_two_processes_take_the_exact_steps_of_the_union_batches(ranks):
    first, second = ranks
    assert first["world_size"] == 2 and first["steps"] == second["steps"] == first["global_step"] == worker.STEPS
    assert all(i % 2 == 0 for _, indices in first["draws"] for i in indices)  # each process its own shard
    assert all(i % 2 == 1 for _, indices in second["draws"] for i in indices)
    assert all(len(indices) <= worker.PHYSICAL for rank in ranks for _, indices in rank["draws"])
    union = defaultdict(list)
    for rank in ranks:
        for draw, indices in rank["draws"]:
            union[draw] += indices
    assert sorted(union) == list(range(worker.STEPS))
    for name, expected in exact_training([union[draw] for draw in range(worker.STEPS)]).items():
        assert torch.equal(first["params"][name], second["params"][name]), f"{name}: the processes differ"
        torch.testing.assert_close(first["params"][name], expected, rtol=1e-5, atol=1e-6, msg=name)


def test_two_processes_log_one_processs_epsilon(ranks):
    from dpnoise.training import PrivacyEngine, PrivacyOptions
    from torch.utils.data import DataLoader

    engine = PrivacyEngine(seed=0)
    model = worker.tiny_bert()
    engine.make_private_with_options(
        model, torch.optim.SGD(model.parameters(), lr=worker.LR),
        DataLoader(worker.Sentences(), batch_size=worker.BATCH),
        privacy=PrivacyOptions(mechanism="gaussian", delta=1e-5, noise=1.0, max_grad_norm=worker.CLIP))
    for _ in range(worker.STEPS):
        engine.record_step()
    for rank in ranks:
        assert rank["epsilon"] == engine.get_epsilon()
        assert rank["logged"][:worker.STEPS] == list(range(1, worker.STEPS + 1))
