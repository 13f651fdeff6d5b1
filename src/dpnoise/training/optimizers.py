"""Optimizers that apply a mechanism and report every step to the privacy engine.

* :class:`NoisyGradientOptimizer` (gradient mechanisms) subclasses Opacus's ``DPOptimizer``: it
  keeps Opacus's parameter handling and mean scaling by the expected batch size, and replaces the
  clipping norm (L2 or exact L1), the noise sampler (Gaussian or Laplace, from the mechanism
  registry) and the source of per-example gradients: Opacus's ``p.grad_sample`` (from
  ``GradSampleModule``) or a :class:`~dpnoise.training.bookkeeping.BookkeepingModule`.
* :class:`OutputPrivateOptimizer` (output mechanisms) wraps a plain optimizer: the noise is in the
  model's forward pass, so the optimizer only gates and records the steps.

Both ask the engine before a step (:meth:`StepGate.admit_step`: refuse past the budget) and report
the step after noising and before the parameter update (:meth:`StepGate.record_step`).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch
from opacus.optimizers import DPOptimizer
# Opacus's processed-flag helpers guard against reusing per-sample gradients across steps.
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch.optim import Optimizer

from dpnoise.mechanisms.clipping import clip_factors, clipped_sum, per_example_norms
from dpnoise.mechanisms.registry import Mechanism
from dpnoise.training.bookkeeping import BookkeepingModule


class StepGate(Protocol):
    """What the optimizers need from the privacy engine."""

    def admit_step(self) -> bool:
        """True if one more step fits the budget; False (stop) or raise when it does not."""

    def record_step(self) -> None:
        """Compose one step into the accountants."""


class NoisyGradientOptimizer(DPOptimizer):
    """DP optimizer: per-example clipping (L2 / L1), mechanism noise on the sum, accounted steps."""

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        mechanism: Mechanism,
        noise: float,
        max_grad_norm: float,
        expected_batch_size: float,
        gate: StepGate,
        generator: Optional[torch.Generator],
        bookkeeping: Optional[BookkeepingModule] = None,
    ):
        """``bookkeeping``: the wrapped model when it is a ``BookkeepingModule``; None when it is
        Opacus's ``GradSampleModule`` (per-example gradients in ``p.grad_sample``)."""
        super().__init__(
            optimizer,
            noise_multiplier=noise,  # unused by Opacus here: add_noise is the mechanism's
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction="mean",
            generator=generator,
        )
        self.mechanism = mechanism
        self.noise = noise
        self.gate = gate
        self.bookkeeping = bookkeeping
        self.attach_step_hook(lambda _optimizer: gate.record_step())

    @property
    def accumulated_iterations(self) -> int:
        """Always 1: a step has one Poisson batch (both gradient sources refuse accumulation)."""
        return 1

    def clip_and_accumulate(self) -> None:
        """Clip each example's gradient to ``max_grad_norm`` in the mechanism's norm; sum."""
        if self.bookkeeping is not None:
            norms = self.bookkeeping.per_example_norms(self.mechanism.clip_norm_ord)
            sums = self.bookkeeping.clipped_sums(self.params, clip_factors(norms, self.max_grad_norm))
        else:
            sums = self._clipped_sums_of_grad_samples()
        for p, summed in zip(self.params, sums):
            p.summed_grad = summed.to(p.dtype)

    def _clipped_sums_of_grad_samples(self) -> list[torch.Tensor]:
        """Clipped sums from Opacus's ``p.grad_sample`` (each used once: processed flags)."""
        grad_samples = self.grad_samples
        if len(grad_samples[0]) == 0:
            factors = torch.zeros((0,), device=grad_samples[0].device)
        else:
            factors = clip_factors(per_example_norms(grad_samples, self.mechanism.clip_norm_ord), self.max_grad_norm)
        sums = []
        for p, grad_sample in zip(self.params, grad_samples):
            _check_processed_flag(p.grad_sample)
            sums.append(clipped_sum(grad_sample.to(p.dtype), factors))
            _mark_as_processed(p.grad_sample)
        return sums

    def add_noise(self) -> None:
        """``p.grad = sum of clipped gradients + mechanism noise`` (units: see the registry)."""
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = self.mechanism.sample_noise(p.summed_grad, self.noise, self.max_grad_norm, self.generator)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> bool:
        """Refuse the step if it does not fit the budget; otherwise clip, noise and record it."""
        if not self.gate.admit_step():
            return False
        self.clip_and_accumulate()
        self.add_noise()
        self.scale_grad()
        self.step_hook(self)
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.bookkeeping is not None:
            self.bookkeeping.clear()
        super().zero_grad(set_to_none)


class OutputPrivateOptimizer(Optimizer):
    """Plain optimizer wrapper for output mechanisms: gates and records each step."""

    def __init__(self, optimizer: Optimizer, *, gate: StepGate):
        # Like Opacus's DPOptimizer, delegate state to the wrapped optimizer instead of
        # calling Optimizer.__init__ (which would copy the parameter groups).
        self.original_optimizer = optimizer
        self.gate = gate

    @property
    def param_groups(self) -> list[dict]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict]) -> None:
        self.original_optimizer.param_groups = param_groups

    @property
    def state(self):
        return self.original_optimizer.state

    @property
    def defaults(self) -> dict:
        return self.original_optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        if not self.gate.admit_step():
            return None
        self.gate.record_step()
        return self.original_optimizer.step(closure)

    def state_dict(self) -> dict:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"OutputPrivateOptimizer({self.original_optimizer!r})"
