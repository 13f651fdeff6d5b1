"""Checkpoints of a private run: model, optimizer, accountants, sampler/noise RNG, step count.

A run interrupted after k steps and resumed from its checkpoint continues with the same batches
and the same noise as the uninterrupted run: the engine's generators (Poisson sampler and
mechanism noise) and torch's global RNG (dropout, ...) are saved with the accountants' state, so
no step is counted twice or forgotten.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from dpnoise.training.engine import PrivacyEngine

CHECKPOINT_FORMAT = 1


def save_checkpoint(
    path: str | os.PathLike,
    *,
    module: nn.Module,
    optimizer: Optimizer,
    engine: PrivacyEngine,
    extra: Optional[dict[str, Any]] = None,
) -> None:
    """Write the private run's full state to ``path`` (atomically: temp file + rename)."""
    state = {
        "format": CHECKPOINT_FORMAT,
        "module": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "engine": engine.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
        "extra": extra or {},
    }
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_checkpoint(
    path: str | os.PathLike, *, module: nn.Module, optimizer: Optimizer, engine: PrivacyEngine
) -> dict[str, Any]:
    """Restore a checkpoint into objects built by ``make_private`` with the same setup.

    Checkpoints are pickles: load only files you wrote or trust.

    Returns the checkpoint's ``extra`` dictionary, with ``"steps"`` (steps already taken) added.
    """
    state = torch.load(Path(path), weights_only=False)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a dpnoise checkpoint (format {state.get('format')!r})")
    engine.load_state_dict(state["engine"])
    module.load_state_dict(state["module"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    return {**state["extra"], "steps": engine.steps}
