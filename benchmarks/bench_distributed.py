"""Training throughput of 2 processes (1 thread each) against 1 process (1 thread), in ONE run, beside
the machine's own ceiling for it.

The tutorial CNN (26,010 parameters) on Fashion-MNIST, lap2 by default, at expected (global) batch sizes
256 (the Lap2 paper's), 1024 and 4096 by default.  Five worker processes are started once and kept:

* "1 process": one alone;
* "2 processes": two joined in a gloo process group (each samples its half of the data at the global
  rate, the noisy clipped sums are all-reduced, docs/DISTRIBUTED.md);
* "2 independent": two processes that each train alone on half of the data at the global rate, with no
  process group: the same work per process as a rank, without the all-reduce and without waiting for
  the other rank.  Their throughput over the 1 process's is the most 2 ranks can reach on this
  machine: it holds what 2 processes lose to sharing the machine's caches and memory bandwidth, and
  that a half batch costs more than half a batch (a step costs a fixed part plus a part per example).

A call of a candidate asks its worker(s) for a number of private steps and waits until they are done:
Poisson sampling of the shard, collation, forward, backward, clipping, noise, the all-reduce and
accounting included; process start-up, imports and ``make_private`` excluded.  Every candidate takes
the same steps of the same expected global batch, so the ratio of throughputs (examples per second) is
the paired ratio of times over interleaved rounds (benchmarks/timing.py).  Printed per batch size: the
2 processes' throughput ratio (target on a 2-core machine: >= 1.7x), the ceiling, and the parallel
efficiency (ratio / ceiling).

On a machine shared with other jobs the processes wait for cores, and a rank that waits holds the
other up at the next all-reduce.  The CPU time each process spends per step is printed beside the
wall time.

    .venv/bin/python benchmarks/bench_distributed.py [--quick] [--rounds 7] [--steps N] [--mechanism lap2]
        [--batch-sizes 256 1024 4096]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import socket
import statistics
import time
import warnings
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist
from timing import interleaved
from torch.utils.data import DataLoader, Subset

from dpnoise.accounting import noise_keywords
from dpnoise.data import load_dataset
from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.training import endless_batches, make_private, train_step

BATCH_SIZES = (256, 1024, 4096)
TARGET = 1.7
#: examples per candidate per round, unless --steps is given (full and quick mode)
ROUND_EXAMPLES, QUICK_EXAMPLES = 5120, 2048


def worker(rank: int, world_size: int, port: int, mechanism: str, batch_size: int, joined: bool,
           connection: Connection) -> None:
    """Make the CNN private on this process's part of the data, then take as many steps as asked,
    answering each request with the CPU seconds this process spent on them; ``None`` ends the worker.

    ``joined``: the ``world_size`` processes form a process group (each rank samples its shard of the
    whole data set at the global rate); otherwise each trains alone on its shard (the shard's size and
    an expected batch of ``batch_size / world_size``: the same sampling rate).
    """
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    data = load_dataset("fashion-mnist", "train")
    if joined and world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
    elif world_size > 1:
        data = Subset(data, range(rank, len(data), world_size))
    local_batch = batch_size if joined else batch_size // world_size
    model = TFPrivacyTutorialCNN()
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), DataLoader(data, batch_size=local_batch),
        mechanism=mechanism, **noise_keywords(mechanism, 1.0), max_grad_norm=1.0, delta=1e-5, seed=0)
    batches = endless_batches(loader)
    connection.send("ready")
    while (steps := connection.recv()) is not None:
        started = time.process_time()
        for _ in range(steps):
            train_step(module, optimizer, next(batches), torch.nn.functional.cross_entropy)
        connection.send(time.process_time() - started)


def start(world_size: int, mechanism: str, batch_size: int, joined: bool) -> list[tuple[mp.Process, Connection]]:
    """``world_size`` workers (joined in a process group, or each alone on its shard), once they are ready."""
    context = mp.get_context("spawn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workers = []
    for rank in range(world_size):
        ours, theirs = context.Pipe()
        process = context.Process(target=worker, args=(rank, world_size, port, mechanism, batch_size, joined, theirs),
                                  daemon=True)
        process.start()
        workers.append((process, ours))
    for _, connection in workers:
        assert connection.recv() == "ready"
    return workers


def steps_on(workers: list[tuple[mp.Process, Connection]], steps: int, cpu: list[list[float]]):
    """A call that has every worker take ``steps`` steps and returns when all are done; it appends the
    workers' CPU seconds to ``cpu``."""
    def call() -> None:
        for _, connection in workers:
            connection.send(steps)
        cpu.append([connection.recv() for _, connection in workers])

    return call


def measure(mechanism: str, batch_size: int, rounds: int, steps: int) -> None:
    """Time 1 process, 2 ranks and 2 independent processes at expected global ``batch_size``; print the
    figures, the ratio, the ceiling and the efficiency."""
    candidates = {"1 process": start(1, mechanism, batch_size, joined=True),
                  "2 processes": start(2, mechanism, batch_size, joined=True),
                  "2 independent": start(2, mechanism, batch_size, joined=False)}
    cpu: dict[str, list[list[float]]] = {name: [] for name in candidates}
    timings = interleaved({name: (lambda i, call=steps_on(workers, steps, cpu[name]): call)
                           for name, workers in candidates.items()}, rounds, warmup=1)
    for workers in candidates.values():
        for process, connection in workers:
            connection.send(None)
            process.join()

    print(f"tutorial CNN (26,010 params), Fashion-MNIST, {mechanism}, expected global batch {batch_size}, "
          f"1 thread per process, {rounds} rounds x {steps} steps, interleaved")
    cpu_per_step = {name: [statistics.median(c[rank] for c in cpu[name][1:]) / steps
                           for rank in range(len(workers))] for name, workers in candidates.items()}
    for name in candidates:
        seconds = timings.median(name)
        print(f"{name:<14} {1000 * seconds / steps:8.1f} ms/step {batch_size * steps / seconds:8.0f} examples/s"
              f"   CPU ms/step per process: {', '.join(f'{1000 * c:.1f}' for c in cpu_per_step[name])}")
    speedup = timings.ratio("1 process", "2 processes")
    ceiling = timings.ratio("1 process", "2 independent")
    print(f"throughput 2 processes / 1 process at batch {batch_size}: {speedup:.2f}x (target >= {TARGET}) "
          f"{'PASS' if speedup >= TARGET else 'MISS'}; rounds: {per_round(timings, '2 processes')}")
    print(f"ceiling, 2 independent processes / 1 process: {ceiling:.2f}x; rounds: {per_round(timings, '2 independent')}")
    print(f"parallel efficiency (throughput ratio / ceiling): {speedup / ceiling:.0%}\n")


def per_round(timings, name: str) -> str:
    """The 1 process's time over ``name``'s in each round (the paired ratio is their median)."""
    return ", ".join(f"{a / b:.2f}" for a, b in zip(timings.seconds["1 process"], timings.seconds[name]))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (else a one-line usage error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"3 rounds of {QUICK_EXAMPLES} examples per candidate (unless given explicitly)")
    parser.add_argument("--rounds", type=positive_int, default=None, help="interleaved measurement rounds (default 7)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help=f"steps per candidate per round (default: {ROUND_EXAMPLES} examples' worth, at least 2: "
                             f"20 steps at batch 256, 5 at 1024, 2 at 4096)")
    parser.add_argument("--mechanism", default="lap2", choices=("gaussian", "lap2", "laplace-l1"),
                        help="gradient mechanism (default lap2)")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=list(BATCH_SIZES),
                        help="expected global batch sizes, each measured in turn (default 256 1024 4096)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    for batch_size in args.batch_sizes:
        steps = args.steps or max(2, (QUICK_EXAMPLES if args.quick else ROUND_EXAMPLES) // batch_size)
        measure(args.mechanism, batch_size, rounds, steps)


if __name__ == "__main__":
    main()
