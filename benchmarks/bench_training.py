"""Step time of every training mechanism on the seed CNN, Fashion-MNIST, batch 256, in ONE run.

Prints (median over interleaved rounds of paired ratios):
  * each mechanism's step time / non-private step time  (target: dirichlet <= 1.2x)
  * dpnoise lap2 step time / plain Opacus Gaussian DP-SGD step time  (target: <= 1.05x)
  * Opacus Gaussian DP-SGD with ghost clipping / with per-example hooks (a candidate speed-up for
    the L2-clipped mechanisms; ghost clipping never materialises per-example gradients, so it
    cannot serve Laplace-L1, whose clipping needs per-example L1 norms)
  * dpnoise lap2 and laplace-l1 with book-keeping clipping (the default, ``grad_sample_mode="auto"``)
    / the same with Opacus's per-example hooks (``grad_sample_mode="hooks"``)

Fairness on a shared, noisy machine: every configuration runs on the same pre-drawn batches of
exactly 256 examples (data loading is excluded), and the configurations are interleaved step by
step, in a fresh shuffled order for every batch (benchmarks/timing.py), so slow phases of the
machine hit all of them alike; ratios are taken per round (paired) and their median is reported.
A "step" is zero_grad + forward + loss + backward + optimizer.step (clipping, noise and accounting
included).

    .venv/bin/python benchmarks/bench_training.py [--quick] [--rounds 7] [--steps 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import torch
from opacus import PrivacyEngine as OpacusPrivacyEngine
from timing import Candidate, fed_by_hand, interleaved
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from dpnoise.accounting import noise_keywords
from dpnoise.data import load_dataset
from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.training import make_private

BATCH_SIZE = 256
#: noise of each dpnoise mechanism in its own unit (the value does not change the step time)
DPNOISE_MECHANISMS = {"gaussian": 1.0, "lap2": 1.0, "laplace-l1": 1.0, "dirichlet": 0.25, "penultimate-gaussian": 2.0}

Step = Callable[[torch.Tensor, torch.Tensor], None]


def plain_step(module: nn.Module, optimizer: torch.optim.Optimizer,
               loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> Step:
    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        module.train()
        optimizer.zero_grad()
        loss(module(x), y).backward()
        optimizer.step()

    return step


def non_private(loader: DataLoader) -> Step:
    model = TFPrivacyTutorialCNN()
    return plain_step(model, torch.optim.Adam(model.parameters(), lr=1e-3))


def opacus_gaussian(loader: DataLoader) -> Step:
    model = TFPrivacyTutorialCNN()
    module, optimizer, _ = OpacusPrivacyEngine().make_private(
        module=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), data_loader=loader,
        noise_multiplier=1.0, max_grad_norm=1.0,
    )
    return plain_step(module, optimizer)


def opacus_gaussian_ghost(loader: DataLoader) -> Step:
    model = TFPrivacyTutorialCNN()
    # ghost clipping runs its second backward pass inside the loss Opacus wraps
    module, optimizer, criterion, _ = OpacusPrivacyEngine().make_private(
        module=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), data_loader=loader,
        criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost",
    )
    return plain_step(module, optimizer, criterion)


def dpnoise_mechanism(mechanism: str, grad_sample_mode: str = "auto") -> Callable[[DataLoader], Step]:
    def build(loader: DataLoader) -> Step:
        model = TFPrivacyTutorialCNN()
        module, optimizer, _ = make_private(
            model, torch.optim.Adam(model.parameters(), lr=1e-3), loader, mechanism=mechanism,
            **noise_keywords(mechanism, DPNOISE_MECHANISMS[mechanism]), max_grad_norm=1.0, delta=1e-5, seed=0,
            grad_sample_mode=grad_sample_mode,
        )
        return plain_step(module, fed_by_hand(optimizer))

    return build


def on_batches(step: Step, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Candidate:
    """The i-th call of ``step`` runs on batch i mod len(batches): every round sees the same batches."""
    return lambda i: (lambda: step(*batches[i % len(batches)]))


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio <= target else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds x 4 steps (unless given explicitly)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved measurement rounds (default 7)")
    parser.add_argument("--steps", type=int, default=None, help="steps per configuration per round (default 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.steps = args.steps or (4 if args.quick else 10)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)

    dataset = load_dataset("fashion-mnist", "train")
    loader = DataLoader(dataset, batch_size=BATCH_SIZE)
    indices = torch.randperm(len(dataset))[: BATCH_SIZE * args.steps].view(args.steps, BATCH_SIZE)
    batches = [dataset[i.tolist()] for i in indices]
    builders = {"non-private": non_private, "opacus-gaussian": opacus_gaussian,
                "opacus-gaussian-ghost": opacus_gaussian_ghost}
    builders.update({f"dpnoise-{m}": dpnoise_mechanism(m) for m in DPNOISE_MECHANISMS})
    builders.update({f"dpnoise-{m}-hooks": dpnoise_mechanism(m, "hooks") for m in ("lap2", "laplace-l1")})
    steps = {name: build(loader) for name, build in builders.items()}
    timings = interleaved({name: on_batches(step, batches) for name, step in steps.items()}, args.rounds,
                          calls=args.steps, warmup=2)

    print(f"seed CNN (26,010 params), Fashion-MNIST, batch {BATCH_SIZE}, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.steps} steps, interleaved")
    print(f"{'configuration':<30}{'ms/step (median)':>18}{'/ non-private':>15}")
    for name in builders:
        ms = 1000 * timings.median(name)
        print(f"{name:<30}{ms:>18.1f}{timings.ratio(name, 'non-private'):>14.2f}x")
    lap2_vs_opacus = timings.ratio("dpnoise-lap2", "opacus-gaussian")
    dirichlet_vs_plain = timings.ratio("dpnoise-dirichlet", "non-private")
    print(f"lap2 / Opacus Gaussian DP-SGD: {lap2_vs_opacus:.3f}x (target <= 1.05) {verdict(lap2_vs_opacus, 1.05)}")
    print(f"dirichlet / non-private:      {dirichlet_vs_plain:.3f}x (target <= 1.2) {verdict(dirichlet_vs_plain, 1.2)}")
    print(f"dpnoise gaussian / Opacus Gaussian: {timings.ratio('dpnoise-gaussian', 'opacus-gaussian'):.3f}x")
    print(f"Opacus ghost clipping / hooks: {timings.ratio('opacus-gaussian-ghost', 'opacus-gaussian'):.3f}x")
    for m in ("lap2", "laplace-l1"):
        print(f"dpnoise {m} book-keeping / hooks: {timings.ratio(f'dpnoise-{m}', f'dpnoise-{m}-hooks'):.3f}x")


if __name__ == "__main__":
    main()
