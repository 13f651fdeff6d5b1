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
