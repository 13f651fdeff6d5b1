"""Tiny models and loaders for the training tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def mlp(hidden: int = 64, seed: int = 0) -> nn.Module:
    """A small classifier for 1x8x8 digits (no batch-mixing layers)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def digits_loader(dataset: Dataset, batch_size: int = 64) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(argv: list[str], world_size: int = 2) -> list[subprocess.Popen]:
    """``python argv`` once per rank, joined through the environment as ``torchrun`` would set it."""
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
        processes.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    return processes


def finish(processes: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each process."""
    outputs = [p.communicate(timeout=timeout) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs)]


def record_draws(engine) -> list[tuple[int, list[int]]]:
    """(Poisson draw, data set indices) of every physical batch a step of ``engine`` takes from now on, in order
    (what each rank drew, for the test to form the union batches)."""
    taken, provenance = [], engine.batch_provenance
    take = provenance.take

    def recording():
        batch = take()
        taken.append((batch.draw, list(batch.indices)))
        return batch

    provenance.take = recording
    return taken


def union_steps(*runs: list[tuple[int, list[int]]]) -> list[list[int]]:
    """The data set indices of each step (Poisson draw), over the ranks' :func:`record_draws`."""
    steps: dict[int, list[int]] = {}
    for draws in runs:
        for draw, indices in draws:
            steps.setdefault(draw, []).extend(indices)
    return [sorted(steps[draw]) for draw in sorted(steps)]


def exact_clipped_sgd(model: nn.Module, example_loss, steps: list[list[int]], clip: float, lr: float,
                      expected_batch_size: float) -> dict[str, torch.Tensor]:
    """``model`` after SGD steps on the exact clipped sums of ``steps`` (plain autograd, example by example:
    ``example_loss(model, i)`` is example i's loss; each gradient clipped to ``clip`` in L2, the sum divided
    by the expected batch size), as {name: parameter}."""
    params = [p for p in model.parameters() if p.requires_grad]
    for indices in steps:
        total = [torch.zeros_like(p) for p in params]
        for i in indices:
            grads = torch.autograd.grad(example_loss(model, i), params)
            factor = min(1.0, clip / (torch.sqrt(sum(g.pow(2).sum() for g in grads)).item() + 1e-6))
            total = [t + factor * g for t, g in zip(total, grads)]
        with torch.no_grad():
            for p, summed in zip(params, total):
                p -= lr * summed / expected_batch_size
    return {name: p.detach() for name, p in model.named_parameters()}
