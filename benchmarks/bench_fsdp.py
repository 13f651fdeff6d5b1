"""Memory per process of a private model sharded with FSDP2 (``fully_shard``) on K ranks, against one process.

A stack of residual blocks (``Linear(width, width)`` + ``LayerNorm``) between an input and an output
``Linear``, trained privately (gaussian, book-keeping, Adam) on random data for a few steps: in one process
unsharded, then on K gloo ranks with ``fully_shard`` per layer (input, blocks, output) and at the root
(docs/DISTRIBUTED.md).  Each process reports, after its last step:

* the bytes of the parameters it holds (a rank: its chunk of every parameter, ``to_local()``);
* the bytes of its optimizer state (Adam's two moments and step counters; a rank: its chunks);
* the bytes of the gradients the last step left in ``p.grad`` (a rank: its chunks);
* the bytes of the step's full-shape buffers (each clipped sum has its full parameter's shape on every
  rank: the rank's examples' full gradients, all-reduced with the noise shares): transient, one step;
* its peak resident memory (``ru_maxrss``: the whole process, torch and Python included) and its median
  step time.

With K ranks the parameters and the optimizer state per process are about 1/K of one process's (chunks of
dimension 0 are rounded up, so a little more).

    .venv/bin/python benchmarks/bench_fsdp.py [--ranks 2] [--width 1024] [--blocks 4] [--batch-size 64] [--steps 5]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import resource
import socket
import statistics
import time
import warnings
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import endless_batches, make_private, train_step

MIB = 2 ** 20
EXAMPLES, CLASSES = 4096, 10


class Block(nn.Module):
    """``x + relu(LayerNorm(Linear(x)))``."""

    def __init__(self, width: int):
        super().__init__()
        self.linear, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.norm(self.linear(x)))


def build_model(width: int, blocks: int) -> nn.Sequential:
    """The input layer, ``blocks`` blocks and the output layer, seeded alike in every process."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), *(Block(width) for _ in range(blocks)), nn.Linear(width, CLASSES))


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this process holds of ``tensor`` (its chunk of a DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def worker(rank: int, ranks: int, port: int, width: int, blocks: int, batch_size: int, steps: int,
           connection: Connection) -> None:
    """Train the model privately for ``steps`` steps (sharded when ``ranks`` > 1) and send what this process holds."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    model = build_model(width, blocks)
    if ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks,
                                timeout=datetime.timedelta(seconds=300))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(EXAMPLES, width, generator=generator),
                         torch.randint(CLASSES, (EXAMPLES,), generator=generator))
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), DataLoader(data, batch_size=batch_size),
        mechanism="gaussian", noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, noise_seed=0,
        per_example_check=False)
    batches = endless_batches(loader)
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step(module, optimizer, next(batches), F.cross_entropy)
        seconds.append(time.perf_counter() - started)
    params = list(model.parameters())
    state = [value for per_param in optimizer.state.values() for value in per_param.values()
             if isinstance(value, torch.Tensor)]
    connection.send(dict(
        params=sum(local_bytes(p) for p in params), state=sum(local_bytes(v) for v in state),
        grads=sum(local_bytes(p.grad) for p in params if p.grad is not None),
        step_buffers=sum(p.numel() * p.element_size() for p in params),  # p.numel(): the full shape, also of a shard
        count=sum(p.numel() for p in params), rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        step=statistics.median(seconds[1:] or seconds)))
    if ranks > 1:
        dist.destroy_process_group()


def run(ranks: int, args: argparse.Namespace) -> list[dict]:
    """What each of ``ranks`` processes holds after training (1: one process, unsharded)."""
    context = mp.get_context("spawn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = []
    for rank in range(ranks):
        ours, theirs = context.Pipe()
        process = context.Process(target=worker, args=(rank, ranks, port, args.width, args.blocks, args.batch_size,
                                                       args.steps, theirs))
        process.start()
        started.append((process, ours))
    results = [connection.recv() for _, connection in started]
    for process, _ in started:
        process.join()
    return results


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (else a one-line usage error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=positive_int, default=2, help="gloo ranks of the sharded run (default 2)")
    parser.add_argument("--width", type=positive_int, default=1024, help="width of the blocks (default 1024)")
    parser.add_argument("--blocks", type=positive_int, default=4, help="residual blocks (default 4)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="expected global batch size (default 64)")
    parser.add_argument("--steps", type=positive_int, default=5, help="private steps per run (default 5)")
    args = parser.parse_args()
    single, = run(1, args)
    sharded = run(args.ranks, args)
    print(f"{single['count']:,} parameters (width {args.width}, {args.blocks} blocks), gaussian, book-keeping, Adam, "
          f"expected batch {args.batch_size}, {args.steps} steps, 1 thread per process, gloo")
    print(f"{'process':<16} {'params MiB':>10} {'Adam MiB':>9} {'both MiB':>9} {'/ 1 process':>11} "
          f"{'grads MiB':>9} {'step buffers MiB':>16} {'peak RSS MiB':>12} {'s/step':>7}")
    for name, held in [("1 process", single), *((f"rank {r} of {args.ranks}", h) for r, h in enumerate(sharded))]:
        both = held["params"] + held["state"]
        print(f"{name:<16} {held['params'] / MIB:10.2f} {held['state'] / MIB:9.2f} {both / MIB:9.2f} "
              f"{both / (single['params'] + single['state']):11.3f} {held['grads'] / MIB:9.2f} "
              f"{held['step_buffers'] / MIB:16.2f} "
              f"{held['rss'] / MIB:12.0f} {held['step']:7.3f}")


if __name__ == "__main__":
    main()
