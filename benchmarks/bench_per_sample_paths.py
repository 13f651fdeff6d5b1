"""Candidate speed-ups of the DP step on the seed CNN, each measured side by side in ONE run.

Prints (median over interleaved rounds of paired ratios, one torch thread, batch 258):
  * Opacus ghost clipping / Opacus per-example hooks, whole Gaussian DP-SGD step
    (ghost clipping never materialises per-example gradients; it could serve the L2-clipped
    mechanisms, not Laplace-L1, whose clipping needs per-example L1 norms)
  * torch's ``F.unfold`` / Opacus's ``unfold2d`` on the activations of each of the CNN's two
    convolutions (the unfold is where per-example conv gradients spend their copies)

    .venv/bin/python benchmarks/bench_per_sample_paths.py [--rounds 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from typing import Callable

import torch
from opacus import PrivacyEngine
from opacus.utils.tensor_utils import unfold2d
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.models.cnn import SeedCNN

BATCH_SIZE = 258


def dp_step(grad_sample_mode: str, loader: DataLoader) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One Opacus Gaussian DP-SGD step (Adam) with the given per-sample gradient mode."""
    model = SeedCNN()
    engine_args = dict(module=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), data_loader=loader,
                       noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=grad_sample_mode,
                       poisson_sampling=False)
    if grad_sample_mode == "ghost":
        module, optimizer, criterion, _ = PrivacyEngine().make_private(criterion=nn.CrossEntropyLoss(), **engine_args)
    else:
        module, optimizer, _ = PrivacyEngine().make_private(**engine_args)
        criterion = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        criterion(module(x), y).backward()
        optimizer.step()

    return step


def paired_ratio(candidate: Callable[[], None], baseline: Callable[[], None], rounds: int, repeats: int) -> float:
    """Median over rounds of (candidate time / baseline time), the two interleaved in random order."""
    ratios = []
    for _ in range(rounds):
        totals = {"candidate": 0.0, "baseline": 0.0}
        for _ in range(repeats):
            order = [("candidate", candidate), ("baseline", baseline)]
            random.shuffle(order)
            for name, run in order:
                started = time.perf_counter()
                run()
                totals[name] += time.perf_counter() - started
        ratios.append(totals["candidate"] / totals["baseline"])
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="steps (or unfolds) per round (default 10)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    images = torch.randn(BATCH_SIZE * args.steps, 1, 28, 28)
    labels = torch.randint(0, 10, (len(images),))
    loader = DataLoader(TensorDataset(images, labels), batch_size=BATCH_SIZE)
    batches = [(images[i:i + BATCH_SIZE], labels[i:i + BATCH_SIZE]) for i in range(0, len(images), BATCH_SIZE)]
    hooks, ghost = dp_step("hooks", loader), dp_step("ghost", loader)
    # each configuration walks the same batches in the same order
    hooks_batches, ghost_batches = iter(batches * args.rounds), iter(batches * args.rounds)
    ratio = paired_ratio(lambda: ghost(*next(ghost_batches)), lambda: hooks(*next(hooks_batches)),
                         args.rounds, args.steps)
    print(f"DP step, ghost clipping / per-example hooks: {ratio:.3f}")

    model = SeedCNN()
    conv_inputs = {"conv1": torch.randn(BATCH_SIZE, 1, 28, 28), "conv2": torch.randn(BATCH_SIZE, 16, 13, 13)}
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    for (name, x), conv in zip(conv_inputs.items(), convs):
        def opacus_unfold() -> torch.Tensor:
            return unfold2d(x, kernel_size=conv.kernel_size, padding=conv.padding, stride=conv.stride,
                            dilation=conv.dilation)

        def torch_unfold() -> torch.Tensor:
            return F.unfold(x, kernel_size=conv.kernel_size, padding=conv.padding, stride=conv.stride,
                            dilation=conv.dilation)

        assert torch.equal(opacus_unfold(), torch_unfold())
        print(f"{name} unfold, F.unfold / Opacus unfold2d: "
              f"{paired_ratio(torch_unfold, opacus_unfold, args.rounds, args.steps):.3f}")


if __name__ == "__main__":
    main()
