"""Private full fine-tuning of EfficientNet-Lite0 (3.38M parameters) on CIFAR-10: book-keeping against hooks.

``build_model("efficientnet-lite0", num_classes=10, resolution=R)``: the ImageNet EfficientNet-Lite0
with a new linear head, every parameter trained, its BatchNorm frozen as depthwise 1x1 affine
convolutions; batches of 32 CIFAR-10 training images (the JPEG set, values in [0, 1], resized by the
model to R x R), Adam, one torch thread.  A step is zero_grad + forward + loss + backward +
optimizer.step: per-example clipping, noise and accounting included.  Configurations:

* ``non-private``: the plain Adam step;
* ``gaussian``, ``lap2``: ``dpnoise.training.make_private`` as a user calls it, gradients by
  book-keeping (the depthwise and grouped convolutions' per-example gradients from
  ``conv2d_per_example_gradients``);
* ``gaussian-hooks``: dpnoise's Gaussian with ``grad_sample_mode="hooks"`` (Opacus's
  ``GradSampleModule``, its grouped-convolution grad sampler included);
* ``opacus-hooks``: Opacus's own ``PrivacyEngine.make_private`` (Gaussian DP-SGD, hooks).

Each configuration runs in its own process (its peak memory is the process's peak resident set):
warm-up steps, then timed steps on the same pre-drawn batches as every other configuration.
Processes are started in a freshly shuffled order in every round (benchmarks/timing.py); a figure is
the median over rounds, a ratio the median over rounds of the ratio within the round.  A
configuration that fails (e.g. out of memory) is reported with its error.

    .venv/bin/python benchmarks/bench_efficientnet.py            # 64 px, 3 rounds x 2 steps
    .venv/bin/python benchmarks/bench_efficientnet.py --quick    # 64 px, 1 round x 1 step
    .venv/bin/python benchmarks/bench_efficientnet.py --resolutions 64 128 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable

from timing import add_process_options, fed_by_hand, interleaved, own_processes, print_process_table, timed_steps

BATCH_SIZE = 32
#: the class-balanced CIFAR-10 subset the batches are drawn from (and the engines' sample rate)
SUBSET = 2000
DP_MECHANISMS = ("gaussian", "lap2")
CONFIGURATIONS = ("non-private", *DP_MECHANISMS, "gaussian-hooks", "opacus-hooks")
#: noise of every private configuration, in its mechanism's unit (it does not change the step time)
NOISE = 1.0
CLIP = 1.0

Batch = tuple[object, object]
Step = Callable[[Batch], None]


def cifar10_batches(steps: int) -> tuple[object, list[Batch]]:
    """The CIFAR-10 subset (values in [0, 1]) and ``steps`` batches of ``BATCH_SIZE`` images drawn from
    it (seeded: every process draws the same batches)."""
    import torch

    from dpnoise.data import load_dataset

    dataset = load_dataset("cifar10-jpeg", "train", limit=SUBSET, normalize=False)
    images, labels = dataset.tensors
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[: steps * BATCH_SIZE]
    return dataset, [(images[indices], labels[indices]) for indices in chosen.view(steps, BATCH_SIZE)]


def non_private_step(model, optimizer, loader) -> Step:
    import torch

    criterion = torch.nn.CrossEntropyLoss()

    def step(batch: Batch) -> None:
        images, labels = batch
        optimizer.zero_grad()
        criterion(model(images), labels).backward()
        optimizer.step()

    return step


def dpnoise_step(mechanism: str, grad_sample_mode: str = "auto") -> Callable[..., Step]:
    def build(model, optimizer, loader) -> Step:
        from dpnoise.accounting import noise_keywords
        from dpnoise.training import make_private

        module, private_optimizer, _ = make_private(model, optimizer, loader, mechanism=mechanism,
                                                    **noise_keywords(mechanism, NOISE), max_grad_norm=CLIP,
                                                    delta=1e-5, grad_sample_mode=grad_sample_mode)
        return non_private_step(module, fed_by_hand(private_optimizer), loader)

    return build


def opacus_step(model, optimizer, loader) -> Step:
    from opacus import PrivacyEngine

    module, private_optimizer, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=NOISE, max_grad_norm=CLIP,
        grad_sample_mode="hooks", poisson_sampling=True)
    return non_private_step(module, private_optimizer, loader)


STEP_BUILDERS = {
    "non-private": non_private_step,
    **{mechanism: dpnoise_step(mechanism) for mechanism in DP_MECHANISMS},
    "gaussian-hooks": dpnoise_step("gaussian", "hooks"),
    "opacus-hooks": opacus_step,
}


def measure(configuration: str, resolution: int, steps: int, warmup: int) -> dict:
    """Run in a child process: ``warmup`` then ``steps`` steps of ``configuration``
    (:func:`timing.timed_steps`), and the number of trained parameters."""
    import torch
    from torch.utils.data import DataLoader

    from dpnoise.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    dataset, batches = cifar10_batches(warmup + steps)
    model = build_model("efficientnet-lite0", num_classes=10, resolution=resolution).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = STEP_BUILDERS[configuration](model, optimizer, DataLoader(dataset, batch_size=BATCH_SIZE))
    return {**timed_steps(step, batches, warmup), "parameters": sum(p.numel() for p in model.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64], help="side the images are resized to")
    add_process_options(parser, CONFIGURATIONS, quick="the first resolution, 1 round x 1 step")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.resolutions[0], args.steps, args.warmup)))
        return
    if args.quick:
        args.resolutions, args.rounds, args.steps = args.resolutions[:1], 1, 1
    configurations = ["non-private", *(c for c in args.configurations if c != "non-private")]
    for resolution in args.resolutions:
        candidates = own_processes(__file__, configurations, lambda name: [
            "--measure", name, "--resolutions", str(resolution), "--steps", str(args.steps),
            "--warmup", str(args.warmup)])
        timings = interleaved(candidates, args.rounds)
        print(f"\n{resolution} px, every parameter ({timings.values['non-private'].get('parameters', 0):,}), batch "
              f"{BATCH_SIZE}, 1 thread, {timings.rounds} rounds")
        print_process_table(configurations, timings)
        for hooks in ("gaussian-hooks", "opacus-hooks"):
            if hooks in configurations and "gaussian" in configurations:
                print(f"{hooks} / gaussian (book-keeping): {timings.ratio(hooks, 'gaussian'):.1f}x")


if __name__ == "__main__":
    main()
