"""The private Trainer on 2 gloo processes started as ``torchrun`` would (``trainer_worker.py``): each process
draws its own shard of every Poisson batch, and every step's update is the exact one of the union batch
(computed here by plain autograd, example by example; noise switched off), with one process's epsilon."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the launch helpers

import trainer_worker as worker  # noqa: E402
from training_helpers import exact_clipped_sgd, finish, launch, union_steps  # noqa: E402

WORKER = Path(__file__).with_name("trainer_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("trainer")
    for code, _, err in finish(launch([str(WORKER), str(out)]), timeout=170):
        assert code == 0, err[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def example_loss(model: torch.nn.Module, i: int) -> torch.Tensor:
    return model(**{name: value.unsqueeze(0) for name, value in worker.Sentences()[i].items()}).loss


def test_two_processes_take_the_exact_steps_of_the_union_batches(ranks):
    first, second = ranks
    assert first["world_size"] == 2 and first["steps"] == second["steps"] == first["global_step"] == worker.STEPS
    assert all(i % 2 == 0 for _, indices in first["draws"] for i in indices)  # each process its own shard
    assert all(i % 2 == 1 for _, indices in second["draws"] for i in indices)
    assert all(len(indices) <= worker.PHYSICAL for rank in ranks for _, indices in rank["draws"])
    steps = union_steps(first["draws"], second["draws"])
    assert len(steps) == worker.STEPS
    exact = exact_clipped_sgd(worker.tiny_bert(), example_loss, steps, worker.CLIP, worker.LR, worker.BATCH)
    for name, expected in exact.items():
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
