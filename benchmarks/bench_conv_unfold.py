"""Unfolding the seed CNN's conv activations: torch's ``F.unfold`` vs Opacus's ``unfold2d``, ONE run.

Opacus computes per-example conv gradients from unfolded activations, and the unfold is where
that computation spends its copies; this checks whether torch's im2col would be a cheaper
grad sampler.  Both unfold the same batch of 258 for each convolution (checked equal), timed with
bench_training's interleaved rounds; prints the median of the paired ratios.

    .venv/bin/python benchmarks/bench_conv_unfold.py [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_training import interleaved_round
from opacus.utils.tensor_utils import unfold2d
from torch import nn
from torch.nn import functional as F

from dpnoise.models.cnn import SeedCNN

BATCH_SIZE = 258


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds (default 7)")
    parser.add_argument("--steps", type=int, default=10, help="unfolds per configuration per round (default 10)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # the activations each convolution of the seed CNN receives on 28x28 inputs
    conv_inputs = {"conv1": torch.randn(BATCH_SIZE, 1, 28, 28), "conv2": torch.randn(BATCH_SIZE, 16, 13, 13)}
    convs = [m for m in SeedCNN().modules() if isinstance(m, nn.Conv2d)]
    for (name, activations), conv in zip(conv_inputs.items(), convs):
        shape = dict(kernel_size=conv.kernel_size, padding=conv.padding, stride=conv.stride, dilation=conv.dilation)
        assert torch.equal(unfold2d(activations, **shape), F.unfold(activations, **shape))
        unfolds = {"opacus": lambda x, _: unfold2d(x, **shape), "torch": lambda x, _: F.unfold(x, **shape)}
        batches = [(activations, torch.empty(0))] * args.steps
        per_round = [interleaved_round(unfolds, batches) for _ in range(args.rounds)]
        ratio = statistics.median(r["torch"] / r["opacus"] for r in per_round)
        print(f"{name} unfold, F.unfold / Opacus unfold2d: {ratio:.3f} (median of {args.rounds} paired rounds)")


if __name__ == "__main__":
    main()
