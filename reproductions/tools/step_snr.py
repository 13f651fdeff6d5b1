"""How much signal one private step carries at the start of a run: the sum of the clipped per-example
gradients of one batch against the noise added to it.

For each record of ``--experiment`` (L2-clipped mechanisms: ``gaussian``, ``lap2``), the run's model is
rebuilt at its initialisation (the pretrained weights; the new head and adapters drawn with the record's
seed, as ``dpnoise train`` draws them), ``--batch`` training examples are drawn with that seed (a fixed
batch, not one of the run's Poisson batches), and this tool prints

* the median per-example gradient norm before clipping, over the record's clipping norm C;
* the coherence ``||sum_i clip_C(g_i)|| / (B C)``: 1 when every clipped gradient points the same way, about
  ``1 / sqrt(B)`` when they are unrelated;
* the step's signal-to-noise ratio ``||sum_i clip_C(g_i)|| / (s sqrt(d))``, ``s`` the standard deviation
  of the noise on each of the ``d`` trained coordinates (``sigma C`` for Gaussian, ``sqrt(2) b`` for
  Laplace of scale ``b``): the norm of the signal over the norm of the noise.

A diagnostic of the setting, computed on public data without noise, not covered by any epsilon.  E.g.
the SST-2 runs with every parameter and with LoRA adapters trained:

    .venv/bin/python -m reproductions.tools.step_snr --experiment finetune-full --only T300 seed0 sst2
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from reproductions.tools import add_finished_run_options, finished_records

#: mechanisms whose per-example gradients are clipped in L2 norm (the quantities above are L2 norms)
L2_CLIPPED_MECHANISMS = ("gaussian", "lap2")
#: the RunSpec fields that set only the noise (and the run's length), not the model, the data or the clipping at
#: initialisation: runs that differ only in these share one clipped sum
NOISE_FIELDS = ("mechanism", "calibrated_with", "target_epsilon", "delta", "steps")


def coherence(clipped_sum_norm: float, batch_size: int, clip: float) -> float:
    """``||sum_i clip_C(g_i)|| / (B C)``: the norm of the clipped sum over its largest possible value."""
    return clipped_sum_norm / (batch_size * clip)


def noise_std(mechanism: str, noise: float, clip: float) -> float:
    """The standard deviation of the noise on one coordinate: ``sigma C`` (Gaussian, ``noise`` the multiplier
    sigma) or ``sqrt(2) b`` (Lap2, ``noise`` the absolute Laplace scale b, as the records hold it)."""
    if mechanism not in L2_CLIPPED_MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(L2_CLIPPED_MECHANISMS)}, got {mechanism!r}")
    return noise * clip if mechanism == "gaussian" else math.sqrt(2.0) * noise


def step_snr(clipped_sum_norm: float, std: float, params: int) -> float:
    """``||sum_i clip_C(g_i)|| / (std sqrt(d))``: the signal's norm over the expected norm of the noise."""
    return clipped_sum_norm / (std * math.sqrt(params))


def initial_state_key(record: dict) -> Any:
    """What the clipped sum of ``record``'s run at initialisation depends on: its specification without
    :data:`NOISE_FIELDS`."""
    from reproductions.tools.evaluate_split import spec_of

    return dataclasses.replace(spec_of(record), **{field: None for field in NOISE_FIELDS})


def clipped_gradient_sum(losses: Iterable[Any], params: Sequence[Any], clip: float) -> tuple[list[float], float]:
    """(per-example gradient norms, norm of the sum of the gradients clipped to ``clip``) for the scalar
    ``losses``, one per example, each a function of ``params``."""
    import torch

    total = [torch.zeros_like(p) for p in params]
    norms = []
    for loss in losses:
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        norms.append(norm)
        scale = min(1.0, clip / norm) if norm > 0 else 0.0
        for summed, grad in zip(total, grads):
            summed.add_(grad, alpha=scale)
    return norms, torch.sqrt(sum((t.double() ** 2).sum() for t in total)).item()


def initial_clipped_sum(record: dict, batch_size: int, run_dir: Path) -> tuple[int, list[float], float]:
    """(trained parameters, per-example norms, clipped-sum norm) of ``batch_size`` training examples at the
    initialisation of ``record``'s run (its folder ``run_dir`` is not read), with the run's loss."""
    import torch

    from dpnoise.training.batches import batch_loss, run_model
    from dpnoise.training.preparation import batch_collation, load_splits, model_for_dataset
    from reproductions.runner import train_config
    from reproductions.tools.evaluate_split import spec_of

    config = train_config(spec_of(record), run_dir)
    # the evaluation split is loaded with the training split but not used: one example of it is enough
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, test_limit=1))
    torch.set_num_threads(config.threads or 1)
    torch.manual_seed(record["seed"])
    model = model_for_dataset(config).eval()  # without dropout, so the numbers do not depend on its draw
    params = [p for p in model.parameters() if p.requires_grad]
    train = load_splits(config)[0]
    chosen = torch.randperm(len(train), generator=torch.Generator().manual_seed(record["seed"]))[:batch_size]
    collate: Callable = batch_collation(train).get("collate_fn") or torch.utils.data.default_collate
    loss_fn = functools.partial(torch.nn.functional.cross_entropy, label_smoothing=float(record["label_smoothing"]))
    examples = (collate([train[i]]) for i in chosen.tolist())
    losses = (batch_loss(run_model(model, batch), batch, loss_fn) for batch in examples)
    norms, clipped_sum_norm = clipped_gradient_sum(losses, params, record["clip"])
    return sum(p.numel() for p in params), norms, clipped_sum_norm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_finished_run_options(parser)
    parser.add_argument("--batch", type=int, default=128, help="examples in the batch (default 128)")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be a positive integer, got {args.batch}")
    records = [r for r in finished_records(args) if r["mechanism"] in L2_CLIPPED_MECHANISMS]
    if not records:
        parser.error("no finished record of an L2-clipped mechanism matches --experiment and --only")
    print("| run | d | median per-example norm / C | coherence | step SNR |\n|---|---|---|---|---|")
    sums: dict[Any, tuple[int, list[float], float]] = {}
    for record in records:
        key = initial_state_key(record)
        if key not in sums:
            sums[key] = initial_clipped_sum(record, args.batch, args.work_dir / args.experiment / record["name"])
        params, norms, clipped_sum_norm = sums[key]
        snr = step_snr(clipped_sum_norm, noise_std(record["mechanism"], record["noise"], record["clip"]), params)
        print(f"| {record['name']} | {params:,} | {np.median(norms) / record['clip']:.3g} | "
              f"{coherence(clipped_sum_norm, args.batch, record['clip']):.3f} | {snr:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
