"""Training throughput of 2 processes (1 thread each) against 1 process (1 thread), in ONE run.

The tutorial CNN (26,010 parameters) on Fashion-MNIST, lap2 by default, at expected (global) batch sizes
256 (the Lap2 paper's) and 1024 by default: a step costs a fixed part (about 7 ms here: Python, hooks,
the optimizer, the collectives) plus a part per example, and 2 processes share only the second, so the
speed-up they can reach grows with the batch.
Three worker processes are started once and kept: one alone, two joined in a gloo process group
(each samples its half of the data at the global rate and the noisy clipped sums are all-reduced,
docs/DISTRIBUTED.md).  A call of a candidate asks its worker(s) for a number of private steps and
waits until they are done: Poisson sampling of the shard, collation, forward, backward, clipping,
noise, the all-reduces and accounting included; process start-up, imports and ``make_private``
excluded.  Both candidates take the same steps of the same expected global batch, so the ratio of
throughputs (examples per second) is the paired ratio of times, 1 process / 2 processes, over
interleaved rounds (benchmarks/timing.py).  Target on a 2-core machine: >= 1.7x.

On a machine shared with other jobs the processes wait for cores, and a rank that waits holds the
other up at the next all-reduce.  The CPU time each process spends per step is printed beside the
wall time: the speed-up the 2 processes would reach with a core each is about the 1-process CPU time
per step over the larger of the 2 ranks' CPU times per step (an estimate: it leaves out the time a
rank waits for the other when both have a core, which the wall-time figure includes).

    .venv/bin/python benchmarks/bench_distributed.py [--quick] [--rounds 5] [--steps 10] [--mechanism lap2]
        [--batch-sizes 256 1024]
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
from torch.utils.data import DataLoader

from dpnoise.accounting import noise_keywords
from dpnoise.data import load_dataset
from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.training import endless_batches, make_private, train_step

BATCH_SIZES = (256, 1024)
TARGET = 1.7


def worker(rank: int, world_size: int, port: int, mechanism: str, batch_size: int, connection: Connection) -> None:
    """Make the CNN private (in a process group when ``world_size`` > 1), then take as many steps as asked,
    answering each request with the CPU seconds this process spent on them; ``None`` ends the worker."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
    model = TFPrivacyTutorialCNN()
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-3),
        DataLoader(load_dataset("fashion-mnist", "train"), batch_size=batch_size), mechanism=mechanism,
        **noise_keywords(mechanism, 1.0), max_grad_norm=1.0, delta=1e-5, seed=0)
    batches = endless_batches(loader)
    connection.send("ready")
    while (steps := connection.recv()) is not None:
        started = time.process_time()
        for _ in range(steps):
            train_step(module, optimizer, next(batches), torch.nn.functional.cross_entropy)
        connection.send(time.process_time() - started)


def start(world_size: int, mechanism: str, batch_size: int) -> list[tuple[mp.Process, Connection]]:
    """``world_size`` workers (joined in a process group when more than one), once they are ready."""
    context = mp.get_context("spawn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workers = []
    for rank in range(world_size):
        ours, theirs = context.Pipe()
        process = context.Process(target=worker, args=(rank, world_size, port, mechanism, batch_size, theirs),
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
    """Time 1 process against 2 at expected global ``batch_size`` and print the figures and the ratio."""
    candidates = {"1 process": start(1, mechanism, batch_size), "2 processes": start(2, mechanism, batch_size)}
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
        print(f"{name:<12} {1000 * seconds / steps:8.1f} ms/step {batch_size * steps / seconds:8.0f} examples/s"
              f"   CPU ms/step per process: {', '.join(f'{1000 * c:.1f}' for c in cpu_per_step[name])}")
    speedup = timings.ratio("1 process", "2 processes")
    print(f"throughput 2 processes / 1 process at batch {batch_size}: {speedup:.2f}x (target >= {TARGET}) "
          f"{'PASS' if speedup >= TARGET else 'MISS'}")
    print(f"with a core per process (estimate from CPU times): "
          f"{cpu_per_step['1 process'][0] / max(cpu_per_step['2 processes']):.2f}x\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 8 steps (unless given explicitly)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved measurement rounds (default 7)")
    parser.add_argument("--steps", type=int, default=None, help="steps per candidate per round (default 20)")
    parser.add_argument("--mechanism", default="lap2", choices=("gaussian", "lap2", "laplace-l1"),
                        help="gradient mechanism (default lap2)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES),
                        help="expected global batch sizes, each measured in turn (default 256 1024)")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.steps = args.steps or (8 if args.quick else 20)
    for batch_size in args.batch_sizes:
        measure(args.mechanism, batch_size, args.rounds, args.steps)


if __name__ == "__main__":
    main()
