"""One rank of the FSDP2 scenarios of ``test_distributed_fsdp.py`` (run as a script, one process per rank).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/training/fsdp_workers.py OUT

joins the gloo process group from the environment, runs every scenario in order (all ranks in step) on a
small model given to ``fully_shard`` per block, the head itself and at the root, and saves what it saw to ``OUT/rank<r>.pt``
for the test to compare with one process.
"""

from __future__ import annotations

import datetime
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import endless_batches, make_private, save_checkpoint, train_step, train_steps
from dpnoise.training.distributed import current_group
from dpnoise.training.errors import (
    CheckpointError,
    EngineStateError,
    UncheckedPerExampleGradientsWarning,
    UnsupportedLayerError,
)
from dpnoise.training.sampling import LogicalBatchTracker

#: token ids (13: the embedding's rows split 7 / 6 between 2 ranks), sequence length, width, classes
VOCABULARY, LENGTH, WIDTH, CLASSES = 13, 5, 8, 3
#: examples in the data set, and in the union batch of the update scenario
EXAMPLES, UNION = 200, 12
#: splits of the union batch between 2 ranks: "halves" (rank r takes r, r+2, ...), "rank 0" (rank 1 is empty)
SPLITS = ("halves", "rank 0")
#: the noisy run: steps, expected batch size, noise multiplier
STEPS, BATCH, NOISE = 4, 20, 1.0
#: the private run's options that every scenario shares
OPTIONS = dict(mechanism="gaussian", noise_multiplier=NOISE, delta=1e-5, max_grad_norm=0.5, per_example_check=False)


class Block(nn.Module):
    """A residual block: ``x + relu(LayerNorm(Linear(x)))``."""

    def __init__(self, width: int):
        super().__init__()
        self.linear, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.norm(self.linear(x)))


class TinyModel(nn.Module):
    """Token ids -> embedding -> mean over positions -> 2 blocks -> classes."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.blocks = nn.Sequential(Block(WIDTH), Block(WIDTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embedding(ids).mean(1)))


class EmbeddingUsedDirectly(TinyModel):
    """The model, whose loss also reaches the embedding's weight outside the embedding's forward (the weight
    is all-gathered with the root's, for the root's forward)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) + 0.0 * self.embedding.weight.sum()


def tiny_model(sharded: bool, model_class: type = TinyModel) -> TinyModel:
    """The model, seeded alike everywhere; ``sharded``: given to ``fully_shard`` per block, the head itself (its
    class becomes FSDP's ``FSDPLinear``), and at the root."""
    torch.manual_seed(0)
    model = model_class()
    if sharded:
        for layer in (*model.blocks, model.head):
            fully_shard(layer)
        fully_shard(model)
    return model


def dataset() -> TensorDataset:
    """Random token ids and labels (the same on every rank)."""
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(VOCABULARY, (EXAMPLES, LENGTH), generator=generator),
                         torch.randint(CLASSES, (EXAMPLES,), generator=generator))


def local_part(x: torch.Tensor, split: str, rank: int) -> torch.Tensor:
    """This rank's part of the union batch ``x``."""
    return x[rank::2] if split == "halves" else (x if rank == 0 else x[:0])


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` as a full plain tensor (shards all-gathered)."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def updates(rank: int) -> dict:
    """One noiseless SGD step (lr 1) on this rank's part of the union batch, for each split: the full
    parameters after it, and the sizes of this rank's parameter shards."""
    data = dataset()
    x, y = data.tensors[0][:UNION], data.tensors[1][:UNION]
    results = {}
    for split in SPLITS:
        model = tiny_model(sharded=True)
        module, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                            DataLoader(data, batch_size=BATCH), **OPTIONS)
        optimizer.logical_batches = LogicalBatchTracker()
        optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
        train_step(module, optimizer, (local_part(x, split, rank), local_part(y, split, rank)), F.cross_entropy)
        results[split] = full_parameters(model)
    results["shard_rows"] = {name: p.to_local().shape[0] for name, p in model.named_parameters()}
    results["seed"] = optimizer.privacy_engine.seed  # no rank gave one: rank 0's
    return results


def noisy_run() -> dict:
    """A few noisy steps with the Poisson loader: steps, epsilon and the full parameters."""
    model = tiny_model(sharded=True)
    module, optimizer, loader = make_private(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                                             DataLoader(dataset(), batch_size=BATCH), noise_seed=0, **OPTIONS)
    engine = optimizer.privacy_engine
    train_steps(module, optimizer, endless_batches(loader), engine, STEPS)
    return dict(steps=engine.steps, epsilon=engine.get_epsilon(), params=full_parameters(model))


def refusals(out: Path) -> dict:
    """The messages of what is refused: a rank's own failure inside a collective (a DTensor the backend cannot
    broadcast), the per-example check and an output mechanism on a sharded model, a gradient that reaches a
    sharded parameter outside book-keeping, and a checkpoint of a sharded model."""
    messages = {}
    data = dataset()
    model = tiny_model(sharded=True, model_class=EmbeddingUsedDirectly)
    module, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                        DataLoader(data, batch_size=BATCH), **OPTIONS)
    optimizer.logical_batches = LogicalBatchTracker()
    try:
        train_step(module, optimizer, (data.tensors[0][:4], data.tensors[1][:4]), F.cross_entropy)
    except EngineStateError as err:
        messages["untracked"] = str(err)
    try:
        save_checkpoint(out / "checkpoint.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    except CheckpointError as err:
        messages["checkpoint"] = str(err)
    model = tiny_model(sharded=True)
    group = current_group(torch.device("cpu"))
    try:  # what make_private did before sharded models were supported
        group._collective("broadcasting rank 0's model", dist.broadcast, model.head.weight, 0)
    except Exception as err:  # noqa: BLE001 - the test reads its type and text
        messages["own failure"] = (type(err).__name__, str(err), getattr(err, "__notes__", []))
    for name, options in (("check", dict(OPTIONS, per_example_check=True)),
                          ("output mechanism", dict(mechanism="dirichlet", concentration=1.0, num_classes=CLASSES,
                                                    delta=1e-5, per_example_check=False))):
        try:
            model = tiny_model(sharded=True)
            make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(dataset(), batch_size=BATCH),
                         **options)
        except UnsupportedLayerError as err:
            messages[name] = str(err)
    return messages


if __name__ == "__main__":
    warnings.filterwarnings("ignore", category=UncheckedPerExampleGradientsWarning)
    warnings.filterwarnings("ignore", message=".*noise_seed.*")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)
    RANK = dist.get_rank()
    results = {"updates": updates(RANK), "noisy": noisy_run(), "refusals": refusals(Path(sys.argv[1]))}
    torch.save(results, Path(sys.argv[1]) / f"rank{RANK}.pt")
    dist.destroy_process_group()
