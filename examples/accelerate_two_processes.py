"""Private training on 2 processes with Hugging Face accelerate: ``accelerator.prepare`` on what make_private returns.

Every process creates the ``Accelerator`` (which starts the process group: gloo on the CPU, nccl on GPUs), then
calls ``make_private`` with the whole data set and the same options, then ``accelerator.prepare``.  Each process
draws its own shard of every Poisson batch, clips its examples, adds its share of the noise, and the noisy sums
are all-reduced: every process applies the update one process would compute from the union of the batches, and
the epsilon is one process's (docs/DISTRIBUTED.md).  accelerate leaves the private model and loader as they are
(no DistributedDataParallel, no re-dealt batches).

Run with plain ``python``, the script starts its own 2 worker processes on this machine (as ``torchrun`` would);
under ``torchrun --nproc-per-node 2`` or ``accelerate launch --num_processes 2`` each launched process is a
worker.  By default a small network on scikit-learn's digits (seconds, what the test suite runs);
``--dataset fashion-mnist`` (or ``mnist``) for the real size.  Prints the test accuracy, the epsilon and the
steps, after checking that every process holds the same model.

    python examples/accelerate_two_processes.py                       # digits, seconds
    python examples/accelerate_two_processes.py --dataset fashion-mnist --epochs 5 --batch-size 256
    accelerate launch --cpu --num_processes 2 examples/accelerate_two_processes.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from dpnoise.data import dataset_info, load_dataset
from dpnoise.training import make_private

#: torchrun's (and accelerate launch's) variables that make a process one rank of a run
LAUNCHED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def network(dataset: str, hidden: int = 64) -> nn.Module:
    """A two-layer network for the data set's images, the same on every process (seeded)."""
    info = dataset_info(dataset)
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, info.num_classes))


def train(args: argparse.Namespace) -> dict:
    """One process's part of the run; the result (rank 0's) once every process holds the same model."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # first: make_private joins its process group
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // accelerator.num_processes))
    model = network(args.dataset)
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=args.lr),
        DataLoader(load_dataset(args.dataset, "train"), batch_size=args.batch_size),  # B: the expected global batch
        mechanism="gaussian", target_epsilon=args.epsilon, delta=1e-5, epochs=args.epochs, max_grad_norm=1.0,
        max_physical_batch_size=args.physical_batch_size, device=accelerator.device)
    engine = optimizer.privacy_engine
    module, optimizer, loader = accelerator.prepare(module, optimizer, loader)
    for _ in range(args.epochs):
        for inputs, targets in loader:  # every process, every step: the same number of batches everywhere
            optimizer.zero_grad()
            if len(targets):  # an empty local batch: no forward pass, the step still adds this process's noise
                accelerator.backward(F.cross_entropy(module(inputs), targets))
            optimizer.step()
    checksum = torch.stack([p.detach().double().sum() for p in module.parameters()]).sum().reshape(1)
    checksums = accelerator.gather(checksum.to(accelerator.device))
    assert torch.all(checksums == checksums[0]), f"the processes hold different models: {checksums.tolist()}"
    return {"accuracy": accuracy(module.unwrap(), args.dataset, accelerator.device),
            "epsilon": engine.get_epsilon(), "delta": engine.setup.delta, "steps": engine.steps,
            "planned_steps": engine.planned_steps, "processes": accelerator.num_processes,
            "sample_rate": engine.setup.sample_rate}


def accuracy(model: nn.Module, dataset: str, device: torch.device) -> float:
    """The model's accuracy on the data set's test split (evaluation is not part of the private mechanism)."""
    images, labels = load_dataset(dataset, "test").tensors
    model.eval()
    with torch.no_grad():
        return (model(images.to(device)).argmax(1).cpu() == labels).float().mean().item()


def launch(argv: list[str], processes: int) -> dict:
    """Start ``processes`` workers of this script on this machine, joined as ``torchrun`` joins them; rank 0's
    result."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workers = [subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                                "WORLD_SIZE": str(processes), "RANK": str(rank),
                                                "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"})
               for rank in range(processes)]
    outputs = [worker.communicate() for worker in workers]
    for rank, (worker, (_, err)) in enumerate(zip(workers, outputs)):
        if worker.returncode != 0:
            raise SystemExit(f"process {rank} failed (exit status {worker.returncode}):\n{err[-3000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits", choices=("digits", "mnist", "fashion-mnist"),
                   help="digits (default, seconds) or the real size, mnist / fashion-mnist")
    p.add_argument("--processes", type=int, default=2, help="processes started by plain python (default 2)")
    p.add_argument("--epsilon", type=float, default=3.0, help="target epsilon (default 3)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch B over all processes (default 64)")
    p.add_argument("--physical-batch-size", type=int, default=32, help="examples per forward pass (default 32)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate (default 1e-2)")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error(f"--processes must be >= 1, got {args.processes}")
    if not all(name in os.environ for name in LAUNCHED):
        result = launch(sys.argv[1:] if argv is None else argv, args.processes)
    else:
        result = train(args)
        if int(os.environ["RANK"]) != 0:
            return result
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
