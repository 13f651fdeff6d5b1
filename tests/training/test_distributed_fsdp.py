"""Private training of a ``fully_shard`` (FSDP2) model on the CPU with gloo and 2 processes.

The scenarios run once in 2 worker processes (``fsdp_workers.py``, one launch for the module) and are
compared here with one process on the unsharded model: the noiseless update of the union batch, split in
halves or all on rank 0, is the one-process update; a noisy run's epsilon is the one-process epsilon after
the same steps; a rank's own failure inside a collective is reported as itself; what is not exact under
sharding is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from dpnoise.training import make_private, train_step
from dpnoise.training.sampling import LogicalBatchTracker

import fsdp_workers as workers
from training_helpers import finish, launch

WORKERS = Path(__file__).with_name("fsdp_workers.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the 2 ranks saw."""
    out = tmp_path_factory.mktemp("fsdp")
    for code, _, err in finish(launch([str(WORKERS), str(out)]), timeout=170):
        assert code == 0, err[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def one_process(optimizer_class=torch.optim.SGD, lr: float = 1.0, **options):
    """The unsharded model made private in this process (no process group) with the workers' options."""
    model = workers.tiny_model(sharded=False)
    module, optimizer, loader = make_private(model, optimizer_class(model.parameters(), lr=lr),
                                             DataLoader(workers.dataset(), batch_size=workers.BATCH),
                                             **workers.OPTIONS, **options)
    return model, module, optimizer, loader


def test_the_sharded_update_is_the_one_process_update_of_the_union_batch(ranks):
    data = workers.dataset()
    model, module, optimizer, _ = one_process(seed=0)
    optimizer.logical_batches = LogicalBatchTracker()
    optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train_step(module, optimizer, (data.tensors[0][:workers.UNION], data.tensors[1][:workers.UNION]),
               F.cross_entropy)
    for split in workers.SPLITS:
        first, second = (rank["updates"][split] for rank in ranks)
        for name, expected in model.named_parameters():
            assert torch.equal(first[name], second[name]), f"{split}, {name}: the ranks hold different models"
            assert not torch.equal(first[name], before[name]), f"{split}, {name}: not trained"
            torch.testing.assert_close(first[name], expected.detach(), rtol=1e-5, atol=1e-7, msg=f"{split}, {name}")


def test_each_rank_holds_its_own_chunk_of_every_parameter(ranks):
    rows = [rank["updates"]["shard_rows"] for rank in ranks]
    assert rows[0]["embedding.weight"] == 7 and rows[1]["embedding.weight"] == 6
    assert rows[0]["head.weight"] == 2 and rows[1]["head.weight"] == 1
    assert all(rows[0][name] + rows[1][name] == p.shape[0]
               for name, p in workers.tiny_model(sharded=False).named_parameters())


def test_ranks_that_give_no_seed_run_with_rank_0s(ranks):
    assert ranks[0]["updates"]["seed"] == ranks[1]["updates"]["seed"]


def test_a_noisy_sharded_run_has_the_one_process_epsilon(ranks):
    first, second = (rank["noisy"] for rank in ranks)
    _, _, optimizer, _ = one_process(seed=0)
    engine = optimizer.privacy_engine
    for _ in range(workers.STEPS):
        engine.record_step()
    assert first["steps"] == second["steps"] == workers.STEPS
    assert first["epsilon"] == second["epsilon"] == engine.get_epsilon()
    for name, value in first["params"].items():
        assert torch.equal(value, second["params"][name]) and torch.isfinite(value).all(), name


def test_a_ranks_own_failure_in_a_collective_is_reported_as_itself(ranks):
    for rank, seen in enumerate(ranks):
        kind, message, notes = seen["refusals"]["own failure"]
        assert "does not have a sharding strategy" in message and "another rank died" not in message
        assert notes == [f"rank {rank} of 2: raised by this rank while broadcasting rank 0's model"]


def test_what_sharding_cannot_do_exactly_is_refused_by_name(ranks):
    for seen in ranks:
        messages = seen["refusals"]
        assert messages["check"].startswith("this fully_shard (FSDP2) model cannot train privately:\n  "
                                            "per_example_check=True")
        assert "the output mechanisms all-reduce the model's own gradients" in messages["output mechanism"]
        assert messages["untracked"].startswith("parameters embedding.weight received gradients outside book-keeping")
        assert messages["checkpoint"].startswith("save_checkpoint: parameter _module.embedding.weight is sharded by "
                                                 "fully_shard")
