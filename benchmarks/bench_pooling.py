"""Seed CNN step with per-example gradients: channels-last max-pooling vs torch's default, ONE run.

Builds the seed CNN twice from the same weights, once with ``nn.MaxPool2d`` (torch's NCHW kernel)
and once with dpnoise's ``MaxPool2dChannelsLast``, wraps both in Opacus' GradSampleModule, and
times forward + backward (per-example gradients included) on the same batch of 258, interleaving
the two in every round. Prints the median step times and the median of the paired ratios, and
checks that the logits are identical.

    .venv/bin/python benchmarks/bench_pooling.py [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from opacus import GradSampleModule
from torch import nn
from torch.nn import functional as F

from dpnoise.models.cnn import MaxPool2dChannelsLast, SeedCNN


def build(default_pooling: bool) -> GradSampleModule:
    torch.manual_seed(0)
    model = SeedCNN()
    if default_pooling:
        for i, layer in enumerate(model.features):
            if isinstance(layer, MaxPool2dChannelsLast):
                model.features[i] = nn.MaxPool2d(layer.kernel_size, layer.stride)
    return GradSampleModule(model)


def step_time(module: GradSampleModule, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        F.cross_entropy(module(x), y).backward()
        for p in module.parameters():
            p.grad, p.grad_sample = None, None
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    x, y = torch.randn(258, 1, 28, 28), torch.randint(0, 10, (258,))
    modules = {"torch MaxPool2d": build(True), "MaxPool2dChannelsLast": build(False)}
    times: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(args.rounds):
        for name, module in modules.items():
            times[name].append(step_time(module, x, y, args.steps))
    with torch.no_grad():
        same = torch.equal(*(m(x) for m in modules.values()))
    for name, values in times.items():
        print(f"{name:>24}: {1000 * statistics.median(values):.1f} ms per step")
    ratios = [new / old for old, new in zip(*times.values())]
    print(f"channels-last / default: {statistics.median(ratios):.3f} (median of {args.rounds} paired rounds); "
          f"identical logits: {same}")


if __name__ == "__main__":
    main()
