"""Per-example gradients of the seed CNN's two convolutions: Opacus's grad sampler vs dpnoise's, ONE run.

Opacus's ``compute_conv_grad_sample`` unfolds the activations (``unfold2d``: a copy) and contracts
them with an einsum that transposes the unfolded tensor (a second copy);
``dpnoise.training.bookkeeping.conv2d_per_example_gradients`` copies channels-last sliding windows
once and takes one batched matmul.  Both compute the same batch of 258 for each convolution
(checked equal), timed with bench_training's interleaved rounds; prints the median of the paired
ratios.  (Until commit 02dbdcd this script compared ``F.unfold`` with ``unfold2d`` instead.)

    .venv/bin/python benchmarks/bench_conv_grad_sample.py [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_training import interleaved_round
from opacus.grad_sample.conv import compute_conv_grad_sample
from torch import nn

from dpnoise.models.cnn import SeedCNN
from dpnoise.training.bookkeeping import CONV_WEIGHT_PERMUTATION, conv2d_per_example_gradients

BATCH_SIZE = 258


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds (default 7)")
    parser.add_argument("--steps", type=int, default=10, help="computations per configuration per round (default 10)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # the activations each convolution of the seed CNN receives on 28x28 inputs
    conv_inputs = {"conv1": torch.randn(BATCH_SIZE, 1, 28, 28), "conv2": torch.randn(BATCH_SIZE, 16, 13, 13)}
    convs = [m for m in SeedCNN().modules() if isinstance(m, nn.Conv2d)]
    for (name, activations), conv in zip(conv_inputs.items(), convs):
        backprops = torch.randn_like(conv(activations))
        opacus = compute_conv_grad_sample(conv, [activations], backprops)[conv.weight]
        ours, _ = conv2d_per_example_gradients(conv, activations, backprops)
        torch.testing.assert_close(ours.permute(0, *[1 + d for d in CONV_WEIGHT_PERMUTATION]), opacus)
        samplers = {
            "opacus": lambda x, g: compute_conv_grad_sample(conv, [x], g),
            "dpnoise": lambda x, g: conv2d_per_example_gradients(conv, x, g),
        }
        batches = [(activations, backprops)] * args.steps
        per_round = [interleaved_round(samplers, batches) for _ in range(args.rounds)]
        ratio = statistics.median(r["dpnoise"] / r["opacus"] for r in per_round)
        ms = {k: 1000 * statistics.median(r[k] for r in per_round) for k in samplers}
        print(f"{name}: dpnoise {ms['dpnoise']:.2f} ms, Opacus {ms['opacus']:.2f} ms; "
              f"dpnoise / Opacus: {ratio:.3f} (median of {args.rounds} paired rounds)")


if __name__ == "__main__":
    main()
