"""Optimizers that apply a mechanism and report every step to the privacy engine.

* :class:`NoisyGradientOptimizer` (gradient mechanisms) wraps a plain optimizer; each step's
  private gradient is owned by one :class:`NoisyGradientSum`: per-example clipping (L2 or exact L1)
  into the step's clipped sum, the mechanism's noise (its law's sampler), and in the distributed
  form the all-reduce with its checks (:class:`DistributedNoisyGradientSum`); divided by the
  expected batch size q N.  Per-example gradients come from Opacus's ``p.grad_sample`` (from
  ``GradSampleModule``) or a :class:`~dpnoise.training.bookkeeping.BookkeepingModule`.
* :class:`OutputPrivateOptimizer` (output mechanisms) wraps a plain optimizer: the noise is in the
  model's forward pass, so the optimizer only gates and records the steps.

How the clipped sums are noised is the ``release`` object the engine hands over
(:mod:`dpnoise.mechanisms.release`): the mechanism's float noise, or in secure mode the exact integer
samplers on a grid with bytes from the operating system's CSPRNG (one process only).

Both ask the engine's step ledger before a step (:meth:`StepGate.admit_step`: refuse past the budget)
and record the step after noising and before the parameter update (:meth:`StepGate.record_step`),
directly: the optimizers see that narrow interface, not the engine.

Logical batches: when the data loader splits a Poisson batch into physical batches
(``make_private(max_physical_batch_size=...)``), ``step()`` after a physical batch that does not
end its logical batch only accumulates (:meth:`NoisyGradientSum.add_batch`: clipped per-example
gradients added to the step's sum; :meth:`OutputPrivateOptimizer.accumulate_physical_batch`:
the batch's gradient weighted by its size), and the step that ends it is the one noised, accounted
and applied.  Two backward passes without a ``step()`` between them are still refused: that would
be plain gradient accumulation, which the accountants do not cover.

Their distributed forms (:class:`DistributedNoisyGradientOptimizer`,
:class:`DistributedOutputPrivateOptimizer`) all-reduce, so that every rank of a process group
applies the update one process would compute from the union of the ranks' batches
(docs/DISTRIBUTED.md).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence, Union

import torch
# Opacus's processed-flag helpers guard against reusing per-sample gradients across steps.
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch.optim import Optimizer

from dpnoise.errors import DpnoiseError
from dpnoise.mechanisms.clipping import AdaptiveClipping, ClippingRule, clipped_sum, clipping_rule, per_example_norms
from dpnoise.mechanisms.registry import Mechanism
from dpnoise.mechanisms.release import Release
from dpnoise.training.bookkeeping import BookkeepingModule
from dpnoise.training.distributed import DistributedError, RankGroup
from dpnoise.training.errors import EngineStateError, InvalidTrainingOptionError, PerExampleCheckError
from dpnoise.training.per_example_gradients import UnitGrouping
from dpnoise.training.privacy_units import PrivacyUnits
from dpnoise.training.provenance import BatchProvenance
from dpnoise.training.sampling import LogicalBatchTracker
from dpnoise.training.sharding import full_like, full_zeros, parameter_gradient


class StepGate(Protocol):
    """What the optimizers need from the privacy engine (its :class:`~dpnoise.training.step_ledger.StepLedger`)."""

    #: steps recorded so far (the distributed optimizers check that every rank holds the same)
    steps: int

    def admit_step(self) -> bool:
        """True if one more step fits the budget; False (stop) or raise when it does not."""

    def record_step(self) -> None:
        """Compose one step into the accountants."""


class WrappedOptimizer(Optimizer):
    """An optimizer that delegates its parameter groups and state to the one it wraps (without calling
    ``Optimizer.__init__``, which would copy the parameter groups), as Opacus's ``DPOptimizer`` does."""

    def __init__(self, optimizer: Optimizer):
        self.original_optimizer = optimizer

    @property
    def params(self) -> list[torch.Tensor]:
        """The trainable parameters, in the order of the parameter groups."""
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    @property
    def param_groups(self) -> list[dict]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict]) -> None:
        self.original_optimizer.param_groups = param_groups

    @property
    def state(self):
        return self.original_optimizer.state

    @state.setter
    def state(self, state) -> None:
        self.original_optimizer.state = state

    @property
    def defaults(self) -> dict:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict) -> None:
        self.original_optimizer.defaults = defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.original_optimizer!r})"

    def signal_skip_step(self, do_skip: bool = True) -> None:
        """Refused: what Opacus's ``BatchMemoryManager`` calls to split a batch, which dpnoise's loader does itself."""
        raise InvalidTrainingOptionError(
            "Opacus's BatchMemoryManager does not drive dpnoise's optimizer: give make_private(..., "
            "max_physical_batch_size=N) instead, and the loader yields each Poisson batch in physical batches of at "
            "most N examples, each followed by the usual optimizer.step() (one accounted step per Poisson batch)")


class NoisyGradientSum:
    """One step's private gradient sum, owned from clipping to release.

    :meth:`add_batch` clips each example's gradient of a physical batch to C in the mechanism's norm
    (L2 or exact L1) and adds the batch's sum to the step's clipped sum; :meth:`release` returns that
    sums as ``release`` releases them (:mod:`dpnoise.mechanisms.release`: the mechanism's float noise, or
    secure mode's exact release of all the sums at once on a grid) and starts the next step's sum.  Per-example gradients come from Opacus's
    ``p.grad_sample`` (``GradSampleModule``) or from ``bookkeeping`` (a
    :class:`~dpnoise.training.bookkeeping.BookkeepingModule`).
    """

    def __init__(self, *, mechanism: Mechanism, clip: float, release: Release,
                 bookkeeping: Optional[BookkeepingModule] = None, clipping: Optional[ClippingRule] = None):
        self.mechanism = mechanism
        #: the privacy units of the data set (None: each example is its own unit)
        self.privacy_units: Optional[PrivacyUnits] = None
        self.clip = clip
        #: the per-example scale factors from the norms (default: flat clipping to ``clip``)
        self.clip_factors = clipping or clipping_rule("flat", clip)
        self.release_sums = release
        self.bookkeeping = bookkeeping
        #: the step's clipped sums so far (None: no physical batch added yet)
        self.sums: Optional[list[torch.Tensor]] = None
        #: the Poisson draw the step releases (its index in this process)
        self.draw = 0

    def add_batch(self, params: list[torch.Tensor], batch_size: int, indices: Optional[Sequence[int]] = None) -> None:
        """Add this physical batch's clipped per-example (or, with :attr:`privacy_units`, per-unit) gradients to
        the step's sum; ``indices``: the batch's examples in the data set.  An empty Poisson batch adds nothing,
        whether or not the model ran on it (Hugging Face models cannot)."""
        units = self._units(params, batch_size, indices)
        if batch_size == 0:
            sums = [full_zeros(p) for p in params]
            self.free_batch(params)
        elif self.bookkeeping is not None:
            norms = self.bookkeeping.per_example_norms(self.mechanism.clip_norm_ord, units)
            sums = self.bookkeeping.clipped_sums(params, self.clip_factors(norms), units)
        else:
            sums = self._clipped_sums_of_grad_samples(params, units)
        sums = [summed.to(p.dtype) for p, summed in zip(params, sums)]
        self.sums = sums if self.sums is None else [a + b for a, b in zip(self.sums, sums)]

    def free_batch(self, params: list[torch.Tensor]) -> None:
        """Forget the physical batch's per-example gradients (its clipped sum is kept)."""
        if self.bookkeeping is not None:
            self.bookkeeping.clear()
        for p in params:
            p.grad_sample = None

    def _units(self, params: list[torch.Tensor], batch_size: int,
               indices: Optional[Sequence[int]]) -> Optional[UnitGrouping]:
        """The privacy units of the batch (None: per example)."""
        if self.privacy_units is None or batch_size == 0:
            return None
        if indices is None or len(indices) != batch_size:
            raise EngineStateError("privacy units need each batch's data set indices: train on the batches of the "
                                   "loader make_private returned")
        return self.privacy_units.grouping(indices, params[0].device)

    def _clipped_sums_of_grad_samples(self, params: list[torch.Tensor],
                                      units: Optional[UnitGrouping] = None) -> list[torch.Tensor]:
        """Clipped sums from Opacus's ``p.grad_sample`` (each used once: processed flags); ``units``: of the
        units' gradients, each the sum of its examples'."""
        grad_samples = [flat_grad_sample(p) for p in params]
        if units is not None:
            grad_samples = [units.summed(grad_sample) for grad_sample in grad_samples]
        if len(grad_samples[0]) == 0:
            factors = torch.zeros((0,), device=grad_samples[0].device)
        else:
            factors = self.clip_factors(per_example_norms(grad_samples, self.mechanism.clip_norm_ord))
        sums = []
        for p, grad_sample in zip(params, grad_samples):
            _check_processed_flag(p.grad_sample)
            sums.append(clipped_sum(grad_sample.to(p.dtype), factors))
            _mark_as_processed(p.grad_sample)
        return sums

    def admit(self, gate: StepGate, params: list[torch.Tensor]) -> bool:
        """Whether the step is taken (the engine's budget guard)."""
        return gate.admit_step()

    def release(self, params: list[torch.Tensor], gate: StepGate) -> list[torch.Tensor]:
        """The step's clipped sums plus the mechanism's noise, shaped as ``params`` (units: see the
        registry); the next :meth:`add_batch` starts a new sum."""
        sums, self.sums = self.sums, None
        released = self.release_sums(sums)
        if isinstance(self.clip_factors, AdaptiveClipping):  # released at C_0: to C_t, and C_t moves
            released = self.clip_factors.release(released)
        return [value.view(p.shape) for p, value in zip(params, released)]

    def discard(self) -> None:
        """Forget the step's sum (a refused step), and adaptive clipping's count with it."""
        self.sums = None
        if isinstance(self.clip_factors, AdaptiveClipping):
            self.clip_factors.discard()


class DistributedNoisyGradientSum(NoisyGradientSum):
    """One rank's part of a step's private gradient sum: the local clipped sum plus this rank's noise
    share, summed over the ranks.

    With ``noise_shares="split"`` every rank adds one of K independent shares of the noise
    (:mod:`dpnoise.mechanisms.noise`); with ``"rank0"`` rank 0 adds all of it.  One all-reduce
    sums the noisy local sums together with a count of the shares added, and checks the ranks' step
    counts; unless the count is K ("split") or 1 ("rank0") and the step counts agree, the step is
    refused on every rank (:class:`DistributedError`), so that no update ever carries less noise
    than the accountants assume.
    """

    def __init__(self, *, group: RankGroup, noise_shares: str, **options):
        super().__init__(**options)
        self.group = group
        self.noise_shares = noise_shares
        #: whether this rank adds noise (a share of it, or all of it on rank 0)
        self.adds_share = noise_share(group, noise_shares)[1]

    def admit(self, gate: StepGate, params: list[torch.Tensor]) -> bool:
        """The engine's decision, taken with the other ranks (:func:`admit_with_the_other_ranks`)."""
        like = [full_like(p) for p in params]  # the step sums full-shape tensors, also for shards
        return admit_with_the_other_ranks(gate, self.group, [*like, like[0].reshape(-1)[:1]], self.draw)

    def release(self, params: list[torch.Tensor], gate: StepGate) -> list[torch.Tensor]:
        """The sum over the ranks of (local clipped sum + noise share); checks the share count."""
        released = super().release(params, gate)
        added = torch.tensor([float(self.adds_share)], dtype=released[0].dtype, device=released[0].device)
        self.group.all_reduce_sum([*released, added], "summing the noisy clipped sums",
                                  same=step_checks(gate, admitted=True, draw=self.draw))
        expected = self.group.world_size if self.noise_shares == "split" else 1
        if int(added.item()) != expected:
            raise DistributedError(f"{int(added.item())} noise shares were added to this step, {expected} expected "
                                   f"(noise_shares={self.noise_shares!r} on {self.group.world_size} ranks): the "
                                   f"update is refused, it would carry another noise than the accountants assume")
        return released


def noise_share(group: Optional[RankGroup], noise_shares: str) -> tuple[int, bool]:
    """(the number K of shares the noise is split into, whether this rank adds one): every rank one of K with
    ``noise_shares="split"``, rank 0 all of it with ``"rank0"``; one process adds it all."""
    if group is None:
        return 1, True
    if noise_shares == "split":
        return group.world_size, True
    return 1, group.rank == 0


def flat_grad_sample(p: torch.Tensor) -> torch.Tensor:
    """``p.grad_sample`` as one tensor (Opacus may hold a list of per-batch tensors)."""
    grad_sample = getattr(p, "grad_sample", None)
    if grad_sample is None:
        raise DpnoiseError("a trained parameter has no per-example gradient: was the backward pass run through "
                           "the private model?")
    return torch.cat(grad_sample, dim=0) if isinstance(grad_sample, list) else grad_sample


class NoisyGradientOptimizer(WrappedOptimizer):
    """DP optimizer: per-example clipping (L2 / L1), mechanism noise on the sum, accounted steps.

    The private gradient of a step is its :class:`NoisyGradientSum` (:attr:`noisy_sum`), divided by
    the expected batch size q N; the step is admitted by the engine's budget guard and recorded by
    its accounting hook (:class:`StepGate`) before the parameter update.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        mechanism: Mechanism,
        release: Release,
        max_grad_norm: float,
        expected_batch_size: float,
        gate: StepGate,
        bookkeeping: Optional[BookkeepingModule] = None,
        logical_batches: Union[BatchProvenance, LogicalBatchTracker, None] = None,
        noisy_sum: Optional[NoisyGradientSum] = None,
        clipping: Optional[ClippingRule] = None,
    ):
        """``bookkeeping``: the wrapped model when it is a ``BookkeepingModule``; None when it is
        Opacus's ``GradSampleModule`` (per-example gradients in ``p.grad_sample``).
        ``logical_batches``: what says which batch a step is about (``take()``): the engine's
        :class:`~dpnoise.training.provenance.BatchProvenance`, which refuses a batch that is not the
        private loader's, or a loader's tracker (None: every backward pass is one whole step).
        ``release``: how the step's clipped sums are noised (:mod:`dpnoise.mechanisms.release`).
        ``noisy_sum``: the step object to use instead of the one these options build (the distributed form's).
        ``clipping``: the per-example scale factors from the norms (:func:`~dpnoise.mechanisms.clipping.clipping_rule`;
        default: flat clipping to ``max_grad_norm``)."""
        super().__init__(optimizer)
        self.mechanism = mechanism
        self.max_grad_norm = max_grad_norm
        self.expected_batch_size = expected_batch_size
        self.gate = gate
        self.logical_batches = logical_batches or LogicalBatchTracker()
        #: run once on the first physical batch of at least 2 examples, before any noise (set by make_private:
        #: the engine's per-example check; None: none)
        self.per_example_check: Optional[Callable[[Any], None]] = None
        self.noisy_sum = noisy_sum or NoisyGradientSum(mechanism=mechanism, clip=max_grad_norm, release=release,
                                                       bookkeeping=bookkeeping, clipping=clipping)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Accumulate a physical batch that does not end its logical batch; otherwise refuse the step if
        it does not fit the budget, or clip, noise, record and apply it."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        params = self.params
        batch = self.logical_batches.take()  # refuses a batch that is not the private loader's
        self.noisy_sum.add_batch(params, batch.size, batch.indices)
        self.noisy_sum.free_batch(params)
        try:
            self._check_per_example(batch)  # before the budget's all-reduce: every rank checks at its first step
        except BaseException:
            self.noisy_sum.discard()
            raise
        if not batch.ends_logical_batch:  # only added to the step's sum
            for p in params:
                p.grad = None
            return None
        self.noisy_sum.draw = batch.draw
        admitted = False
        try:
            admitted = self.noisy_sum.admit(self.gate, params)
        finally:  # refused, or raised (over budget, another rank refused): the step's sum is gone
            if not admitted:
                self.noisy_sum.discard()
        if not admitted:
            return None
        for p, released in zip(params, self.noisy_sum.release(params, self.gate)):
            p.grad = parameter_gradient(p, released / self.expected_batch_size)
        self.gate.record_step()
        return self.original_optimizer.step()

    def _check_per_example(self, batch) -> None:
        """Run :attr:`per_example_check` on the step's batch (its clipped sum taken, nothing noised yet) if it has
        at least 2 examples; after it passes, no more (a failure raises, and the next step checks again)."""
        registered = getattr(batch, "batch", None)
        if self.per_example_check is None or registered is None or (batch.size or 0) < 2:
            return
        self.per_example_check(registered)
        self.per_example_check = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad`` and the per-example gradients; a logical batch's clipped sum so far is kept."""
        self.noisy_sum.free_batch(self.params)
        super().zero_grad(set_to_none)


class DistributedNoisyGradientOptimizer(NoisyGradientOptimizer):
    """One rank's DP optimizer: its :class:`DistributedNoisyGradientSum`; then every rank divides by the
    expected global batch size q N, as one process does."""

    def __init__(self, optimizer: Optimizer, *, group: RankGroup, noise_shares: str, **options):
        noisy_sum = DistributedNoisyGradientSum(
            group=group, noise_shares=noise_shares, mechanism=options["mechanism"], clip=options["max_grad_norm"],
            release=options["release"], bookkeeping=options.get("bookkeeping"), clipping=options.get("clipping"))
        super().__init__(optimizer, noisy_sum=noisy_sum, **options)
        self.group = group

    def _check_per_example(self, batch) -> None:
        """Every rank checks its own batch at its first ``step()`` (a rank whose physical batch has fewer than 2
        examples checks nothing) and the ranks agree before any noise: a failure on one rank refuses the step on
        all of them, instead of leaving the others waiting in the step's all-reduce."""
        if self.per_example_check is None:
            return
        failure = None
        try:
            super()._check_per_example(batch)
        except PerExampleCheckError as err:
            failure = err
        failed = torch.tensor([float(failure is not None)], device=self.group.device)
        self.group.all_reduce_sum([failed], "agreeing on the per-example check")
        if failure is not None:
            raise failure
        if failed.item():
            raise PerExampleCheckError(f"the per-example check failed on {int(failed.item())} other rank(s) (their "
                                       f"error names the parameter); nothing was noised or accounted")
        self.per_example_check = None


class OutputPrivateOptimizer(WrappedOptimizer):
    """Plain optimizer wrapper for output mechanisms: gates and records each step.

    The update is the gradient of the mean loss over the logical batch: with physical batches,
    each one's gradient is weighted by its size (``module``, the private model, has a forward
    pre-hook that reads the size of each training batch).
    """

    def __init__(self, optimizer: Optimizer, *, gate: StepGate, module: torch.nn.Module,
                 logical_batches: Union[BatchProvenance, LogicalBatchTracker, None] = None):
        super().__init__(optimizer)
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

    def weighted_gradients(self) -> list[torch.Tensor]:
        """This physical batch's mean-loss gradient times its size, per trainable parameter."""
        return [torch.zeros_like(p) if p.grad is None else p.grad * self.batch_size for p in self.params]

    def accumulate_physical_batch(self) -> None:
        """Add this physical batch's gradient, weighted by its size, to the step's sums; free ``p.grad``."""
        weighted = self.weighted_gradients()
        self.accumulated = weighted if self.accumulated is None else [a + w for a, w in zip(self.accumulated, weighted)]
        self.accumulated_examples += self.batch_size
        for p in self.params:
            p.grad = None

    def logical_batch_sums(self) -> tuple[list[torch.Tensor], int]:
        """(size-weighted gradient sums, examples) of the whole logical batch; resets the accumulation."""
        sums, examples = self.weighted_gradients(), self.batch_size
        if self.accumulated is not None:
            sums = [a + w for a, w in zip(self.accumulated, sums)]
            examples += self.accumulated_examples
        self.accumulated, self.accumulated_examples = None, 0
        return sums, examples

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        if not self.logical_batches.take().ends_logical_batch:
            self.accumulate_physical_batch()
            return None
        if self.accumulated is not None:  # the mean over the physical batches' examples
            sums, examples = self.logical_batch_sums()
            for p, summed in zip(self.params, sums):
                p.grad = summed / max(examples, 1)
        if not self.gate.admit_step():
            return None
        self.gate.record_step()
        return self.original_optimizer.step(closure)


class DistributedOutputPrivateOptimizer(OutputPrivateOptimizer):
    """One rank's optimizer for an output mechanism: the gradient of the mean loss over the union of
    the ranks' (logical) batches (each rank's size-weighted gradient sums and sizes, all-reduced).

    The noise is in each example's output, drawn by each rank's own generator; nothing is added here.
    """

    def __init__(self, optimizer: Optimizer, *, group: RankGroup, **options):
        super().__init__(optimizer, **options)
        self.group = group

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        batch = self.logical_batches.take()
        if not batch.ends_logical_batch:
            self.accumulate_physical_batch()
            return None
        draw = batch.draw
        sums, examples = self.logical_batch_sums()
        if not admit_with_the_other_ranks(self.gate, self.group, [*sums, sums[0].reshape(-1)[:1]], draw):
            return None
        size = torch.tensor([float(examples)], dtype=sums[0].dtype, device=sums[0].device)
        self.group.all_reduce_sum([*sums, size], "summing the gradients",
                                  same=step_checks(self.gate, admitted=True, draw=draw))
        for p, summed in zip(self.params, sums):
            p.grad = summed / size.clamp(min=1.0)
        self.gate.record_step()
        return self.original_optimizer.step(closure)


def step_checks(gate: StepGate, admitted: bool, draw: int) -> dict[str, int]:
    """What every rank must agree on in a step's all-reduce: its step count, whether it takes the step and
    the Poisson draw it releases (the ranks' samplers draw in lockstep: a wrapper that deals different
    draws to different ranks is refused)."""
    return {"step count": gate.steps, "step admission (1: taken)": int(admitted), "Poisson draw": draw}


def admit_with_the_other_ranks(gate: StepGate, group: RankGroup, like: list[torch.Tensor],
                               draw: int) -> bool:
    """``gate.admit_step()``, with a rank that refuses the step (or raises) still joining the step's all-reduce.

    ``like``: tensors of the shapes and dtypes the step's all-reduce sums.  Ranks with the same ledger
    decide alike, and a refusal is then a last all-reduce of zeros; but a rank that refuses while
    another takes the step would leave it blocked in the all-reduce (and pair its next collective with
    the wrong one), so the refusing rank joins that all-reduce with zeros and its admission in the
    checked values: every rank then raises :class:`DistributedError` naming the disagreement.
    """
    def join_as_refused() -> None:
        group.all_reduce_sum([torch.zeros_like(t) for t in like], "refusing the step", step_checks(gate, False, draw))

    try:
        admitted = gate.admit_step()
    except DpnoiseError:  # the budget, under on_budget_exhausted="raise": the other ranks must hear of it
        join_as_refused()
        raise
    if not admitted:
        join_as_refused()
    return admitted
