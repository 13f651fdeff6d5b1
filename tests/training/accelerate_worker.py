"""One rank of ``test_provenance.py``'s two-process ``accelerate`` scenario (run as a script, one process per rank).

    RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/training/accelerate_worker.py

``accelerate``'s ``prepare()`` around the private loader under two processes: prints this rank's steps, or the
error that refused a step.
"""

from __future__ import annotations

import warnings

import torch
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.training import make_private

warnings.simplefilter("ignore")
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
data = TensorDataset(torch.randn(400, 5), torch.randint(0, 2, (400,)))
model = torch.nn.Linear(5, 2)
module, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                         DataLoader(data, batch_size=40), mechanism="gaussian", noise_multiplier=1.0,
                                         delta=1e-5, seed=0)
engine = optimizer.privacy_engine
module, optimizer, loader = accelerator.prepare(module, optimizer, loader)
try:
    for inputs, targets in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(module(inputs), targets))
        optimizer.step()
        if engine.steps == 3:
            break
    print(f"steps {engine.steps}", flush=True)
except Exception as err:  # noqa: BLE001  (the test reads what refused the step)
    print(f"{type(err).__name__}: {err}; steps {engine.steps}", flush=True)
