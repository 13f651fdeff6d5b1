"""Optimizers that apply a mechanism and report every step to the privacy engine.

* :class:`NoisyGradientOptimizer` (gradient mechanisms) subclasses Opacus's ``DPOptimizer``: it
  keeps Opacus's parameter handling and mean scaling by the expected batch size, and replaces the
  clipping norm (L2 or exact L1), the noise sampler (Gaussian or Laplace, from the mechanism
  registry) and the source of per-example gradients: Opacus's ``p.grad_sample`` (from
  ``GradSampleModule``) or a :class:`~dpnoise.training.bookkeeping.BookkeepingModule`.
* :class:`OutputPrivateOptimizer` (output mechanisms) wraps a plain optimizer: the noise is in the
  model's forward pass, so the optimizer only gates and records the steps.

Secure mode (``secure_plan``): the clipped sums are released by the exact integer samplers of
:mod:`dpnoise.mechanisms.secure_noise` on the plan's grid, with bytes from the operating system's
CSPRNG, instead of sum + float noise (one process only).

Both ask the engine's step ledger before a step (:meth:`StepGate.admit_step`: refuse past the budget)
and report the step after noising and before the parameter update (:meth:`StepGate.record_step`).

Logical batches: when the data loader splits a Poisson batch into physical batches
(``make_private(max_physical_batch_size=...)``), ``step()`` after a physical batch that does not
end its logical batch only accumulates (:meth:`NoisyGradientOptimizer.accumulate_physical_batch`:
clipped per-example gradients added to the step's sum; :meth:`OutputPrivateOptimizer.accumulate_physical_batch`:
the batch's gradient weighted by its size), and the step that ends it is the one noised, accounted
and applied.  Two backward passes without a ``step()`` between them are still refused: that would
be plain gradient accumulation, which the accountants do not cover.

Their distributed forms (:class:`DistributedNoisyGradientOptimizer`,
:class:`DistributedOutputPrivateOptimizer`) all-reduce, so that every rank of a process group
applies the update one process would compute from the union of the ranks' batches
(docs/DISTRIBUTED.md).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch
from opacus.optimizers import DPOptimizer
# Opacus's processed-flag helpers guard against reusing per-sample gradients across steps.
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch.optim import Optimizer

from dpnoise.errors import DpnoiseError
from dpnoise.mechanisms.clipping import clip_factors, clipped_sum, per_example_norms
from dpnoise.mechanisms.registry import Mechanism
from dpnoise.mechanisms.secure_noise import Plan, SystemRandomBits, secure_noisy_sums
from dpnoise.training.bookkeeping import BookkeepingModule
from dpnoise.training.distributed import DistributedError, RankGroup
from dpnoise.training.sampling import LogicalBatchTracker


class StepGate(Protocol):
    """What the optimizers need from the privacy engine (its :class:`~dpnoise.training.step_ledger.StepLedger`)."""

    #: steps recorded so far (the distributed optimizers check that every rank holds the same)
    steps: int

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
        logical_batches: Optional[LogicalBatchTracker] = None,
        secure_plan: Optional[Plan] = None,
    ):
        """``bookkeeping``: the wrapped model when it is a ``BookkeepingModule``; None when it is
        Opacus's ``GradSampleModule`` (per-example gradients in ``p.grad_sample``).
        ``logical_batches``: the loader's tracker of physical batches (None: every batch is a step).
        ``secure_plan``: secure mode's grid and integer noise parameters for all the noised
        coordinates (None: the mechanism's float sampler with ``generator``)."""
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
        self.logical_batches = logical_batches or LogicalBatchTracker()
        self.secure_plan = secure_plan
        #: secure mode's random bytes: the OS's CSPRNG (nothing to seed or checkpoint)
        self.random_bits = SystemRandomBits() if secure_plan is not None else None
        self.attach_step_hook(lambda _optimizer: gate.record_step())

    @property
    def accumulated_iterations(self) -> int:
        """Always 1: a step has one Poisson batch (its physical batches are one logical batch)."""
        return 1

    def clip_and_accumulate(self) -> None:
        """Clip each example's gradient to ``max_grad_norm`` in the mechanism's norm and add the sum
        to ``p.summed_grad`` (the step's clipped sum over its physical batches).  An empty Poisson
        batch adds nothing, whether or not the model ran on it (Hugging Face models cannot)."""
        if self.logical_batches.batch_size == 0:
            sums = [torch.zeros_like(p) for p in self.params]
            if self.bookkeeping is not None:
                self.bookkeeping.clear()
            for p in self.params:
                p.grad_sample = None
        elif self.bookkeeping is not None:
            norms = self.bookkeeping.per_example_norms(self.mechanism.clip_norm_ord)
            sums = self.bookkeeping.clipped_sums(self.params, clip_factors(norms, self.max_grad_norm))
        else:
            sums = self._clipped_sums_of_grad_samples()
        for p, summed in zip(self.params, sums):
            summed = summed.to(p.dtype)
            p.summed_grad = summed if getattr(p, "summed_grad", None) is None else p.summed_grad + summed

    def accumulate_physical_batch(self) -> None:
        """Add this physical batch's clipped per-example gradients to the step's clipped sum, then
        free them for the next physical batch of the same logical batch.  Nothing is noised,
        applied or accounted: the step that ends the logical batch does that once."""
        self.clip_and_accumulate()
        for p in self.params:
            p.grad_sample = None
            p.grad = None
        self._is_last_step_skipped = True  # zero_grad keeps the step's clipped sum

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

    def admit_step(self) -> bool:
        """Whether the privacy engine admits this step (False: stop; or it raises)."""
        return self.gate.admit_step()

    def sample_noise(self, reference: torch.Tensor) -> torch.Tensor:
        """The mechanism's noise for one parameter's clipped sum ``reference`` (same shape, dtype, device)."""
        return self.mechanism.sample_noise(reference, self.noise, self.max_grad_norm, self.generator, 1)

    def add_noise(self) -> None:
        """``p.grad = sum of clipped gradients + mechanism noise`` (units: see the registry); in
        secure mode the plan's release of all the sums at once, a multiple of its grid."""
        if self.secure_plan is not None:
            for p in self.params:
                _check_processed_flag(p.summed_grad)
            released = secure_noisy_sums([p.summed_grad for p in self.params], self.secure_plan, self.random_bits)
            for p, value in zip(self.params, released):
                p.grad = value.view_as(p)
                _mark_as_processed(p.summed_grad)
            return
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            p.grad = (p.summed_grad + self.sample_noise(p.summed_grad)).view_as(p)
            _mark_as_processed(p.summed_grad)

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> bool:
        """Accumulate a physical batch that does not end its logical batch; otherwise refuse the
        step if it does not fit the budget, or clip, noise and record it."""
        if not self.logical_batches.ends_logical_batch:
            self.accumulate_physical_batch()
            return False
        self._is_last_step_skipped = False  # whatever happens now, the next zero_grad starts a new sum
        if not self.admit_step():
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


class DistributedNoisyGradientOptimizer(NoisyGradientOptimizer):
    """One rank's DP optimizer: local clipped sum + this rank's noise share, summed over the ranks.

    With ``noise_shares="split"`` every rank adds one of K independent shares of the noise
    (:mod:`dpnoise.mechanisms.noise`); with ``"rank0"`` rank 0 adds all of it.  One all-reduce
    sums the noisy local sums together with a count of the shares added, and checks the ranks' step
    counts; unless the count is K ("split") or 1 ("rank0") and the step counts agree, the step is
    refused on every rank (:class:`DistributedError`), so that no update ever carries less noise
    than the accountants assume.  Then every rank divides by the expected
    global batch size q N, as one process does.
    """

    def __init__(self, optimizer: Optimizer, *, group: RankGroup, noise_shares: str, **options):
        super().__init__(optimizer, **options)
        self.group = group
        self.noise_shares = noise_shares
        #: shares the noise is split into, and whether this rank adds one
        self.shares = group.world_size if noise_shares == "split" else 1
        self.adds_share = noise_shares == "split" or group.rank == 0

    def admit_step(self) -> bool:
        """The engine's decision, taken with the other ranks (:func:`admit_with_the_other_ranks`)."""
        return admit_with_the_other_ranks(self.gate, self.group, [*self.params, self.params[0].reshape(-1)[:1]])

    def sample_noise(self, reference: torch.Tensor) -> torch.Tensor:
        """This rank's share of the noise (zero on ranks other than 0 with ``noise_shares="rank0"``)."""
        if not self.adds_share:
            return torch.zeros_like(reference)
        return self.mechanism.sample_noise(reference, self.noise, self.max_grad_norm, self.generator, self.shares)

    def add_noise(self) -> None:
        """``p.grad`` = sum over the ranks of (local clipped sum + noise share); checks the share count."""
        super().add_noise()
        added = torch.tensor([float(self.adds_share)], dtype=self.params[0].grad.dtype,
                             device=self.params[0].grad.device)
        self.group.all_reduce_sum([*(p.grad for p in self.params), added], "summing the noisy clipped sums",
                                  same=step_checks(self.gate, admitted=True))
        expected = self.group.world_size if self.noise_shares == "split" else 1
        if int(added.item()) != expected:
            raise DistributedError(f"{int(added.item())} noise shares were added to this step, {expected} expected "
                                   f"(noise_shares={self.noise_shares!r} on {self.group.world_size} ranks): the "
                                   f"update is refused, it would carry another noise than the accountants assume")


class OutputPrivateOptimizer(Optimizer):
    """Plain optimizer wrapper for output mechanisms: gates and records each step.

    The update is the gradient of the mean loss over the logical batch: with physical batches,
    each one's gradient is weighted by its size (``module``, the private model, has a forward
    pre-hook that reads the size of each training batch).
    """

    def __init__(self, optimizer: Optimizer, *, gate: StepGate, module: torch.nn.Module,
                 logical_batches: Optional[LogicalBatchTracker] = None):
        # Like Opacus's DPOptimizer, delegate state to the wrapped optimizer instead of
        # calling Optimizer.__init__ (which would copy the parameter groups).
        self.original_optimizer = optimizer
        self.gate = gate
        self.logical_batches = logical_batches or LogicalBatchTracker()
        #: size of the last training batch, and the step's size-weighted gradient sums so far
        self.batch_size = 0
        self.accumulated: Optional[list[torch.Tensor]] = None
        self.accumulated_examples = 0
        module.register_forward_pre_hook(self._read_batch_size)

    def _read_batch_size(self, module: torch.nn.Module, args: tuple) -> None:
        if module.training:
            self.batch_size = len(args[0])

    @property
    def trainable_params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def weighted_gradients(self) -> list[torch.Tensor]:
        """This physical batch's mean-loss gradient times its size, per trainable parameter."""
        return [torch.zeros_like(p) if p.grad is None else p.grad * self.batch_size for p in self.trainable_params]

    def accumulate_physical_batch(self) -> None:
        """Add this physical batch's gradient, weighted by its size, to the step's sums; free ``p.grad``."""
        weighted = self.weighted_gradients()
        self.accumulated = weighted if self.accumulated is None else [a + w for a, w in zip(self.accumulated, weighted)]
        self.accumulated_examples += self.batch_size
        for p in self.trainable_params:
            p.grad = None

    def logical_batch_sums(self) -> tuple[list[torch.Tensor], int]:
        """(size-weighted gradient sums, examples) of the whole logical batch; resets the accumulation."""
        sums, examples = self.weighted_gradients(), self.batch_size
        if self.accumulated is not None:
            sums = [a + w for a, w in zip(self.accumulated, sums)]
            examples += self.accumulated_examples
        self.accumulated, self.accumulated_examples = None, 0
        return sums, examples

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
        if not self.logical_batches.ends_logical_batch:
            self.accumulate_physical_batch()
            return None
        if self.accumulated is not None:  # the mean over the physical batches' examples
            sums, examples = self.logical_batch_sums()
            for p, summed in zip(self.trainable_params, sums):
                p.grad = summed / max(examples, 1)
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


class DistributedOutputPrivateOptimizer(OutputPrivateOptimizer):
    """One rank's optimizer for an output mechanism: the gradient of the mean loss over the union of
    the ranks' (logical) batches (each rank's size-weighted gradient sums and sizes, all-reduced).

    The noise is in each example's output, drawn by each rank's own generator; nothing is added here.
    """

    def __init__(self, optimizer: Optimizer, *, group: RankGroup, **options):
        super().__init__(optimizer, **options)
        self.group = group

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        if not self.logical_batches.ends_logical_batch:
            self.accumulate_physical_batch()
            return None
        sums, examples = self.logical_batch_sums()
        if not admit_with_the_other_ranks(self.gate, self.group, [*sums, sums[0].reshape(-1)[:1]]):
            return None
        size = torch.tensor([float(examples)], dtype=sums[0].dtype, device=sums[0].device)
        self.group.all_reduce_sum([*sums, size], "summing the gradients", same=step_checks(self.gate, admitted=True))
        for p, summed in zip(self.trainable_params, sums):
            p.grad = summed / size.clamp(min=1.0)
        self.gate.record_step()
        return self.original_optimizer.step(closure)


def step_checks(gate: StepGate, admitted: bool) -> dict[str, int]:
    """What every rank must agree on in a step's all-reduce: its step count and whether it takes the step."""
    return {"step count": gate.steps, "step admission (1: taken)": int(admitted)}


def admit_with_the_other_ranks(gate: StepGate, group: RankGroup, like: list[torch.Tensor]) -> bool:
    """``gate.admit_step()``, with a rank that refuses the step (or raises) still joining the step's all-reduce.

    ``like``: tensors of the shapes and dtypes the step's all-reduce sums.  Ranks with the same ledger
    decide alike, and a refusal is then a last all-reduce of zeros; but a rank that refuses while
    another takes the step would leave it blocked in the all-reduce (and pair its next collective with
    the wrong one), so the refusing rank joins that all-reduce with zeros and its admission in the
    checked values: every rank then raises :class:`DistributedError` naming the disagreement.
    """
    def join_as_refused() -> None:
        group.all_reduce_sum([torch.zeros_like(t) for t in like], "refusing the step", step_checks(gate, False))

    try:
        admitted = gate.admit_step()
    except DpnoiseError:  # the budget, under on_budget_exhausted="raise": the other ranks must hear of it
        join_as_refused()
        raise
    if not admitted:
        join_as_refused()
    return admitted
