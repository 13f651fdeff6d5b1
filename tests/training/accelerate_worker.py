"""``accelerate``'s ``prepare()`` around dpnoise's private objects: the scenarios of ``test_accelerate.py``.

Imported by the test (one process) and run as a script, one process per rank, as ``torchrun`` would start it:

    RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/training/accelerate_worker.py OUT

Each rank runs every scenario in order (all ranks in step) and saves what it saw to ``OUT/rank<r>.pt``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import make_private
from training_helpers import record_draws

#: examples, expected (global) Poisson batch, examples per forward pass, steps of each run
EXAMPLES, BATCH, PHYSICAL, STEPS = 120, 24, 5, 3
#: the clipping norm (below most examples' gradient norms: clipping is at work) and SGD's learning rate
CLIP, LR = 0.5, 0.5
OPTIONS = dict(mechanism="gaussian", delta=1e-5, max_grad_norm=CLIP, max_physical_batch_size=PHYSICAL)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(EXAMPLES, 6, generator=generator),
                         torch.randint(0, 3, (EXAMPLES,), generator=generator))


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def private(noise_multiplier: float) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    """The tiny model, SGD and the data set made private (noise off where ``noise_multiplier`` is 0)."""
    model = tiny_model()
    module, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=LR),
                                             DataLoader(dataset(), batch_size=BATCH),
                                             noise_multiplier=max(noise_multiplier, 1.0), **OPTIONS)
    if noise_multiplier == 0:  # the test hook that switches the noise off (the clipped sums are compared)
        optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
    return module, optimizer, loader


def prepared_run(accelerator, noise_multiplier: float) -> dict:
    """``accelerator.prepare`` on the private objects, then the user's loop for :data:`STEPS` steps: the
    pieces each step took, the steps and epsilon, and the parameters."""
    module, optimizer, loader = private(noise_multiplier)
    engine = optimizer.privacy_engine
    draws = record_draws(engine)
    module, optimizer, loader = accelerator.prepare(module, optimizer, loader)
    for inputs, targets in loader:
        optimizer.zero_grad()
        if len(targets):  # an empty local batch: no forward pass; the step still adds this rank's noise share
            accelerator.backward(F.cross_entropy(module(inputs), targets))
        optimizer.step()
        if engine.steps == STEPS:
            break
    return dict(draws=draws, steps=engine.steps, epsilon=engine.get_epsilon(),
                params={name: p.detach().clone() for name, p in module.unwrap().named_parameters()},
                prepared=(type(module).__name__, type(loader).__name__, type(optimizer).__name__))


def made_before_the_accelerator() -> str:
    """make_private before ``Accelerator()`` started the process group: refused at ``prepare()``."""
    from accelerate import Accelerator

    module, optimizer, loader = private(0.0)
    try:
        Accelerator(cpu=True).prepare(module, optimizer, loader)
    except Exception as err:  # noqa: BLE001  (the test reads the refusal)
        return f"{type(err).__name__}: {err}"
    return "not refused"


if __name__ == "__main__":
    from accelerate import Accelerator

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    results = {"early": made_before_the_accelerator()}
    accelerator = Accelerator(cpu=True)
    results["noiseless"] = prepared_run(accelerator, 0.0)
    results["noisy"] = prepared_run(accelerator, 1.0)
    torch.save(results, Path(sys.argv[1]) / f"rank{accelerator.process_index}.pt")
