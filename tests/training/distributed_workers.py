"""One rank of the distributed scenarios of ``test_distributed.py`` (run as a script, one process per rank).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/training/distributed_workers.py OUT [ARGS]

joins the gloo process group from the environment, runs every library scenario in order (all ranks in
step) and saves what it saw to ``OUT/rank<r>.pt`` for the test to compare with one process; then, in
the same process group, runs ``dpnoise train ARGS`` (which the test interrupts by killing a rank) and
exits with its status.  One launch for both: starting a process costs more than the scenarios.
"""

from __future__ import annotations

import datetime
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

from dpnoise.accounting import UnsoundAccountantWarning, noise_keywords
from dpnoise.cli.main import main
from dpnoise.data import load_dataset
from dpnoise.training import endless_batches, make_private, train_step, train_steps
from dpnoise.training.distributed import DistributedError
from dpnoise.training.errors import PerExampleCheckError
from dpnoise.training.provenance import DrawnBatch
from dpnoise.training.sampling import LogicalBatchTracker

from training_helpers import digits_loader, mlp

#: examples of the union batch in the clipped-sum scenario (the first of the digits training set)
UNION = 20
#: gradient mechanisms and their noise for the clipped-sum scenario
GRADIENT_MECHANISMS = {"gaussian": 1.0, "lap2": 1.0, "laplace-l1": 1.0}
#: splits of the union batch between 2 ranks: "halves" (rank r takes r, r+2, ...), "rank 0" (rank 1 is empty),
#: "halves in pieces" (the halves, each rank's in physical batches of PIECES[rank] examples)
SPLITS = ("halves", "rank 0", "halves in pieces")
PIECES = {0: 3, 1: 4}
#: the budget scenario: fixed noise, a target the accountant allows for a few steps only
BUDGET = {"lap2": dict(noise=2.0, target_epsilon=0.45, accountant="lap2-rdp"),
          "dirichlet": dict(noise=0.05, target_epsilon=0.95)}
SHARE_SAMPLES = 200_000


def local_part(x: torch.Tensor, split: str, rank: int, world_size: int) -> torch.Tensor:
    """This rank's part of the union batch ``x``."""
    if split in ("halves", "halves in pieces"):
        return x[rank::world_size]
    return x if rank == 0 else x[:0]


def private(mechanism: str, grad_sample_mode: str = "auto", hand_fed: bool = True, **options):
    """(module, optimizer, loader) of a fresh 16-unit MLP made private on the digits training set.

    ``hand_fed``: the scenarios feed chosen batches (parts of one union batch) instead of the loader's, so the
    optimizer is told about each batch by hand (a ``LogicalBatchTracker``), not by the loader's provenance."""
    model = mlp(hidden=16, seed=0)
    noise = noise_keywords(mechanism, options.pop("noise", GRADIENT_MECHANISMS.get(mechanism)))
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(TRAIN, 64), mechanism=mechanism,
        delta=1e-5, max_grad_norm=1.0, seed=0, noise_seed=0, grad_sample_mode=grad_sample_mode, **noise, **options)
    if hand_fed:
        optimizer.logical_batches = LogicalBatchTracker()
    return module, optimizer, loader


def clipped_sums(rank: int, world_size: int) -> dict:
    """Noise switched off (the test hook: ``optimizer.noisy_sum.release_sums.noise_of``), one step on this rank's part of the
    union batch; the gradient each rank applies, for every mechanism, gradient source and split."""
    x, y = TRAIN.tensors[0][:UNION], TRAIN.tensors[1][:UNION]
    grads = {}
    for mechanism in GRADIENT_MECHANISMS:
        for source in ("bookkeeping", "hooks"):
            for split in SPLITS:
                module, optimizer, _ = private(mechanism, source)
                optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
                batch = (local_part(x, split, rank, world_size), local_part(y, split, rank, world_size))
                local_step(module, optimizer, batch, PIECES[rank] if split == "halves in pieces" else None)
                grads[mechanism, source, split] = [p.grad.clone() for p in optimizer.params]
    return grads


def local_step(module, optimizer, batch: tuple[torch.Tensor, torch.Tensor], pieces: int | None) -> None:
    """One step on ``batch``; with ``pieces``, in physical batches of that many examples (the ranks then
    take different numbers of physical batches for the same step)."""
    if pieces is None:
        train_step(module, optimizer, batch, F.cross_entropy)
        return
    starts = range(0, len(batch[1]), pieces)
    for piece, start in enumerate(starts):  # what the private loader tells the optimizer
        optimizer.logical_batches.last = DrawnBatch(range(start, min(start + pieces, len(batch[1]))), draw=0,
                                                    piece=piece, pieces=len(starts))
        train_step(module, optimizer, tuple(t[start:start + pieces] for t in batch), F.cross_entropy)


def noise_shares(rank: int) -> dict:
    """This rank's own noise share (its engine's generator) of lap2 and gaussian, at noise 1 and C = 1."""
    shares = {}
    for mechanism in ("lap2", "gaussian"):
        _, optimizer, _ = private(mechanism)
        shares[mechanism] = optimizer.noisy_sum.release_sums.noise_of(torch.zeros(SHARE_SAMPLES, dtype=torch.float64))
    return shares


def refusals(rank: int) -> dict:
    """The messages each rank gets when a rank adds no noise share, skips a step's count, or was set up
    with another noise (each scenario fails on every rank)."""
    x, y = TRAIN.tensors[0][:UNION], TRAIN.tensors[1][:UNION]
    messages = {}
    module, optimizer, _ = private("lap2")
    optimizer.noisy_sum.adds_share = optimizer.noisy_sum.release_sums.adds_share = rank == 0  # rank 1 "forgets" its share
    try:
        train_step(module, optimizer, (x[rank::2], y[rank::2]), F.cross_entropy)
    except DistributedError as err:
        messages["missing share"] = str(err)
    for mechanism, name in (("gaussian", "step count"), ("dirichlet", "step count, output mechanism")):
        module, optimizer, _ = private(mechanism, **({"noise": 0.1} if mechanism == "dirichlet" else {}))
        optimizer.privacy_engine.steps += rank  # rank 1 believes it took one step more
        before = [p.detach().clone() for p in module.parameters()]
        try:
            train_step(module, optimizer, (x[rank::2], y[rank::2]), F.nll_loss if mechanism == "dirichlet"
                       else F.cross_entropy)
        except DistributedError as err:
            messages[name] = str(err)
        messages[name + " applied"] = not all(torch.equal(b, p) for b, p in zip(before, module.parameters()))
    for policy in ("stop", "raise"):  # rank 0 is at the budget, rank 1 a step before it: neither may hang
        module, optimizer, _ = private("lap2", on_budget_exhausted=policy, **BUDGET["lap2"])
        engine = optimizer.privacy_engine
        engine.steps = engine.max_steps - rank
        try:
            train_step(module, optimizer, (x[rank::2], y[rank::2]), F.cross_entropy)
        except DistributedError as err:
            messages[f"budget boundary, {policy}"] = str(err)
    try:
        private("gaussian", noise=1.0 + rank)
    except DistributedError as err:
        messages["setup"] = str(err)
    return messages


class CentredOnOneRank(torch.nn.Module):
    """The digits MLP, whose inputs are centred on the batch mean on rank 0 only (there, examples mix)."""

    def __init__(self, mixes: bool):
        super().__init__()
        self.mlp, self.mixes = mlp(hidden=16, seed=0), mixes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x - x.mean(0) if self.mixes else x)


def per_example_check(rank: int) -> dict:
    """A model that mixes the examples on rank 0 only: what each rank's first step raises, the steps taken and
    whether the parameters moved (the check's failure on one rank must refuse the step on both, with no hang)."""
    model = CentredOnOneRank(mixes=rank == 0)
    before = [p.detach().clone() for p in model.parameters()]
    module, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                             digits_loader(TRAIN, 64), mechanism="gaussian", noise_multiplier=1.0,
                                             delta=1e-5, seed=0)
    try:
        train_step(module, optimizer, next(iter(loader)), F.cross_entropy)
        message = None
    except PerExampleCheckError as err:
        message = str(err)
    return dict(message=message, steps=optimizer.privacy_engine.steps,
                moved=not all(torch.equal(a, b) for a, b in zip(before, model.parameters())))


def public_seeds() -> dict:
    """The public seed each rank's engine runs with when no rank gave one (rank 0's), and whether make_private
    went through (it used to be refused: "ranks disagree on the privacy setup: seed")."""
    model = mlp(hidden=16, seed=0)
    _, optimizer, _ = make_private(model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(TRAIN, 64),
                                   mechanism="gaussian", noise_multiplier=1.0, delta=1e-5)
    return dict(seed=optimizer.privacy_engine.seed)


def budget_runs() -> dict:
    """Train with the loader until the budget stops the run: steps, budget, epsilon and a parameter checksum."""
    runs = {}
    for mechanism, options in BUDGET.items():
        module, optimizer, loader = private(mechanism, hand_fed=False, on_budget_exhausted="stop", **options)
        engine = optimizer.privacy_engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsoundAccountantWarning)
            train_steps(module, optimizer, endless_batches(loader), engine, 200)
        runs[mechanism] = dict(steps=engine.steps, max_steps=engine.max_steps, exhausted=engine.budget_exhausted,
                               epsilon=engine.get_epsilon(), params=[p.detach().clone() for p in module.parameters()])
    return runs


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    started = time.perf_counter()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)
    RANK, WORLD_SIZE = dist.get_rank(), dist.get_world_size()
    TRAIN = load_dataset("digits", "train")
    results = {}
    for name, scenario in (("clipped_sums", lambda: clipped_sums(RANK, WORLD_SIZE)), ("shares", lambda: noise_shares(RANK)),
                           ("refusals", lambda: refusals(RANK)), ("check", lambda: per_example_check(RANK)),
                           ("budget", budget_runs), ("public_seed", public_seeds)):
        results[name] = scenario()
        print(f"rank {RANK}: {name} done at {time.perf_counter() - started:.1f} s", file=sys.stderr)
    torch.save(results, Path(sys.argv[1]) / f"rank{RANK}.pt")
    sys.exit(main(["train", *sys.argv[2:]]))
