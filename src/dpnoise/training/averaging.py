"""An exponential moving average (EMA) of the parameters, and learning-rate schedules.

Both are post-processing of the private iterates: every parameter vector DP-SGD releases is covered
by the accountants, so an average of them, or a step size chosen in advance, costs no privacy.
De et al., "Unlocking High-Accuracy Differentially Private Image Classification through Scale"
(arXiv 2204.13650, section 3) evaluate an EMA of the parameters with the warm-up
min(decay, (1 + t) / (10 + t)), so that a short run is not dominated by its random initialisation.
The average is torch's :class:`~torch.optim.swa_utils.AveragedModel`; the schedules are torch's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler
from torch.optim.swa_utils import AveragedModel


def warmed_up_decay(decay: float, updates: int) -> float:
    """The decay after ``updates`` averaged steps: min(decay, (1 + t) / (10 + t)) (arXiv 2204.13650, §3)."""
    return min(decay, (1.0 + updates) / (10.0 + updates))


def parameter_average(model: nn.Module, decay: float) -> AveragedModel:
    """An EMA of ``model``'s parameters and buffers; ``update_parameters(model)`` after every step.

    Build it from the plain model before ``make_private`` wraps it (the copy then carries no
    per-example hooks), and move it to the run's device.
    """

    def average(averaged: torch.Tensor, current: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        weight = warmed_up_decay(decay, int(updates))
        return averaged * weight + current * (1.0 - weight)

    return AveragedModel(model, avg_fn=average, use_buffers=True)


def learning_rate_schedule(optimizer: torch.optim.Optimizer, name: str, steps: int) -> LRScheduler | None:
    """``"cosine"``: the lr decays from its value to 0 over ``steps`` steps (Loshchilov & Hutter,
    arXiv 1608.03983, without restarts); ``"constant"``: None.  Step it once per optimizer step."""
    if name == "constant":
        return None
    # A private optimizer delegates its parameter groups to the optimizer it wraps.
    return CosineAnnealingLR(getattr(optimizer, "original_optimizer", optimizer), T_max=max(steps, 1))
