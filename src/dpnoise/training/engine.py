"""The privacy engine: wraps model, optimizer and data loader, and owns the accounting.

Accounting is coupled to sampling: the engine builds the Poisson data loader, reads the real
sample rate from it, and composes exactly one step into every applicable accountant per optimizer
step (the optimizer calls :meth:`PrivacyEngine.record_step`).  Before each step it checks the
budget of the primary accountant (:meth:`PrivacyEngine.admit_step`).

Devices and processes: the model, the batches, the clipping, the noise and the sampler's draws are
on one device (``device=``, :mod:`dpnoise.training.devices`).  Inside an initialised process group
of K > 1 ranks, each rank samples its shard at the global rate q and the noisy clipped sums are
all-reduced (:mod:`dpnoise.training.distributed`, docs/DISTRIBUTED.md); the accountants see q and
count the same steps as one process would, on every rank.
"""

from __future__ import annotations

import logging
import secrets
import warnings
from dataclasses import asdict
from functools import partial
from collections.abc import Hashable
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnoise import checks
from dpnoise.accounting import (
    ACCOUNTANTS,
    CalibrationResult,
    InvalidParameterError,
    PrivacyAccountant,
    accountant_holding,
    get_mechanism_spec,
    epsilon_of_events,
    MechanismOptions,
    noise_from_keywords,
)
from dpnoise.accounting.events import DpEvent
from dpnoise.accounting.validation import check_count
from dpnoise.prepared import leave_to_dpnoise
from dpnoise.mechanisms.clipping import AdaptiveClipping
from dpnoise.mechanisms.registry import Mechanism, get_mechanism
from dpnoise.models.registry import count_trainable_parameters
from dpnoise.mechanisms.secure_noise import Plan
from dpnoise.training.accelerate_setup import check_accelerate_setup
from dpnoise.training.batches import LossFunction, check_keyword_batch
from dpnoise.training.devices import DeviceLike, module_float_dtype, to_device
from dpnoise.training.distributed import RankGroup, generator_seeds
from dpnoise.training.engine_state import ResumingRun, capture_engine_state, check_engine_state, with_discrete_steps
from dpnoise.training.forwarding import Forwarded
from dpnoise.training.execution import ExecutionOptions, GradSampleMode
from dpnoise.training.randomness import PrivateRandomness, ReproducibleNoiseWarning, reproducible_noise_warning
from dpnoise.training.errors import EngineStateError, InvalidTrainingOptionError
from dpnoise.training.privacy_plan import (
    PrivacyOptions,
    PrivacyPlan,
    PrivacySetup,
    resolve,
)
from dpnoise.training.per_example_check import PerExampleCheckReport, verify_per_example_gradients
from dpnoise.training.provenance import BatchProvenance
from dpnoise.training.secure_mode import secure_noise_plan, secure_noise_record
from dpnoise.training.sampling import LogicalBatchTracker, shard_indices, training_loader
from dpnoise.training.step_ledger import BudgetPolicy, StepLedger
from dpnoise.training.validation import check_private_run
from dpnoise.training.wrapping import run_clipping, step_release, wrap_private

logger = logging.getLogger(__name__)


def _options(mechanism: str, options: Optional[MechanismOptions], **fields: Any) -> MechanismOptions:
    """The mechanism's options from ``options`` or its fields as keywords (not both), refused as an option of
    ``make_private``."""
    try:
        return get_mechanism_spec(mechanism).make_options(options, **fields)
    except InvalidParameterError as err:
        raise InvalidTrainingOptionError(str(err)) from None


def _no_steps_yet() -> EngineStateError:
    return EngineStateError("the engine has no steps before make_private")


def _in_plan(name: str, empty: Any, doc: str) -> Forwarded:
    """An engine attribute that is its plan's (``empty`` before make_private)."""
    return Forwarded("plan", name, empty, doc)


def _in_ledger(name: str, empty: Any, doc: str, settable: bool = False) -> Forwarded:
    """An engine attribute that is its step ledger's (``empty`` before make_private)."""
    return Forwarded("ledger", name, empty, doc, settable=settable, refusal=_no_steps_yet)


class PrivacyEngine:
    """Makes a model, optimizer and data loader private and tracks the privacy spent.

    Randomness (:mod:`dpnoise.training.randomness`): the Poisson sampler's and the noise's generators are
    seeded from the operating system's entropy on every rank and never stored, unless ``noise_seed`` makes
    them reproducible (:class:`ReproducibleNoiseWarning`).  The public ``seed`` drives the data-loader
    workers' seeds only; in a process group where no rank gave one, every rank takes rank 0's.
    """

    def __init__(self, seed: Optional[int] = None, *, noise_seed: Optional[int] = None):
        self.seed = torch.seed() if seed is None else checks.seed("seed", seed)
        self._seed_given = seed is not None
        #: the run's identity, which its checkpoints carry and a resume adopts (the run record's key:
        #: :mod:`dpnoise.training.run_record`)
        self.run_id: str = secrets.token_hex(16)
        if noise_seed is not None:
            noise_seed = checks.seed("noise_seed", noise_seed)
            warnings.warn(reproducible_noise_warning(noise_seed), ReproducibleNoiseWarning, stacklevel=2)
        #: the explicit seed of the private randomness (None: secret, from the OS's entropy)
        self.noise_seed: Optional[int] = noise_seed
        #: the noise and sampling generators of this rank (:class:`~dpnoise.training.randomness.PrivateRandomness`)
        self.randomness = PrivateRandomness(noise_seed)
        #: the run's device and, in a process group of K > 1 ranks, this rank's place in it
        self.device: Optional[torch.device] = None
        self.group: Optional[RankGroup] = None
        self.mechanism: Optional[Mechanism] = None
        self.accountants: dict[str, PrivacyAccountant] = {}
        #: the run's privacy as resolved by make_private (setup, step event, calibration, budget)
        self.plan: Optional[PrivacyPlan] = None
        #: the run's step accounting (step event, counter, budget), which the optimizers are given
        self.ledger: Optional[StepLedger] = None
        #: per-example gradient source in use ("bookkeeping" or "hooks"; None for output mechanisms)
        self.grad_sample_mode: Optional[str] = None
        #: each trainable layer's per-example gradient source, by "<path> (<type>)"
        #: (:func:`~dpnoise.training.bookkeeping.gradient_sources`; None for output mechanisms)
        self.gradient_sources: Optional[dict[str, str]] = None
        #: the physical batches the Poisson loader yielded, in order (set by make_private)
        self.logical_batches: Optional[LogicalBatchTracker] = None
        #: the private loader's batches and the forward passes that used them, which every optimizer step
        #: checks (None without Poisson sampling)
        self.batch_provenance: Optional[BatchProvenance] = None
        #: secure mode's grid and integer noise parameters (None outside secure mode)
        self.secure_plan: Optional[Plan] = None
        #: the per-example check of the first batch (None: not run yet, or not run in this setting)
        self.per_example_report: Optional[PerExampleCheckReport] = None
        #: adaptive clipping's threshold and count (None: another clipping rule)
        self.adaptive_clipping: Optional[AdaptiveClipping] = None

    # ----------------------------------------------------------------------------- wrapping
    def make_private(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader,
        *,
        mechanism: str,
        delta: float,
        noise: Optional[float] = None,
        noise_multiplier: Optional[float] = None,
        laplace_scale: Optional[float] = None,
        concentration: Optional[float] = None,
        target_epsilon: Optional[float] = None,
        epochs: Optional[float] = None,
        max_grad_norm: float = 1.0,
        clipping: str = "flat",
        clipping_gamma: Optional[float] = None,
        target_quantile: Optional[float] = None,
        clipping_lr: Optional[float] = None,
        quantile_noise: Optional[float] = None,
        quantile_noise_law: Optional[str] = None,
        options: Optional[MechanismOptions] = None,
        alpha: Optional[float] = None,
        num_classes: Optional[int] = None,
        accountant: Optional[str] = None,
        calibrate_with: Optional[str] = None,
        poisson_sampling: bool = True,
        on_budget_exhausted: BudgetPolicy = "raise",
        grad_sample_mode: GradSampleMode = "auto",
        device: Optional[DeviceLike] = None,
        noise_shares: str = "split",
        max_physical_batch_size: Optional[int] = None,
        data_releases: Sequence[DpEvent] = (),
        secure_mode: bool = False,
        loss_fn: Optional[LossFunction] = None,
        per_example_check: bool = True,
        privacy_unit: Optional[Sequence[Hashable]] = None,
    ) -> tuple[nn.Module, Optimizer, DataLoader]:
        """Return the private (module, optimizer, data loader).

        Every keyword but ``loss_fn`` is a field of :class:`~dpnoise.training.privacy_plan.PrivacyOptions` (what is
        released: ``mechanism``, ``delta``, the noise, ``target_epsilon``, ``epochs``, ``max_grad_norm``,
        ``clipping``, ``clipping_gamma``, adaptive clipping's ``target_quantile``, ``clipping_lr``,
        ``quantile_noise`` and ``quantile_noise_law``, the
        mechanism's ``options``, ``accountant``, ``calibrate_with``, ``on_budget_exhausted``, ``data_releases``,
        ``secure_mode``) or of :class:`~dpnoise.training.execution.ExecutionOptions` (how the run executes:
        ``poisson_sampling``, ``grad_sample_mode``, ``device``, ``noise_shares``, ``max_physical_batch_size``,
        ``per_example_check``), with the same name and meaning, documented there; the noise may be given under
        its unit's keyword (``noise_multiplier``, ``laplace_scale``, ``concentration``) and the Dirichlet
        options as ``alpha`` and ``num_classes``.

        Args:
            module: the model, in training mode (a model in eval mode, as Hugging Face's
                ``from_pretrained`` returns it, is refused: call ``model.train()``), with at least one
                trainable parameter. Batch normalisation is refused.
            optimizer: a torch optimizer over ``module``'s trainable parameters (refused if it holds a
                tensor that is not a parameter of ``module``, or none of the trainable ones).
            data_loader: its dataset and ``batch_size`` (the expected batch size) are used, and its
                ``collate_fn``.  Examples may be ``(inputs, target)`` pairs or dicts of the model's
                keyword arguments (Hugging Face: ``input_ids``, ``attention_mask``, ...), whose batches
                must hold ``labels`` (refused otherwise).  An empty Poisson batch has the structure of
                the others with zero examples; a loop may skip the forward pass on it and call
                ``optimizer.step()`` alone, which takes the noise-only step (Hugging Face models cannot
                run on zero examples).
            loss_fn: the training loss ``loss_fn(logits, labels)``, the mean over the batch's examples, as the
                training loop computes it (None: the model's own ``outputs.loss`` for dict batches, the
                cross-entropy for pairs); what the per-example check differentiates.  A Hugging Face causal
                language model needs ``loss_fn=dpnoise.training.causal_lm_loss`` (its ``outputs.loss`` is the
                mean over the batch's tokens, which mixes the examples: refused).
            privacy_unit: one key per example of the data set (a user or document id): the unit the epsilon
                protects, all its examples together (:mod:`dpnoise.training.privacy_units`; units are
                Poisson-sampled at ``batch_size`` / (number of units), and each unit's gradient clipped as
                one).  None: each example is its own unit.
        """
        # Every argument is checked here, before any work (errors name the parameter).
        if self.setup is not None:
            raise EngineStateError("this PrivacyEngine already made a model private; create a new one")
        get_mechanism(mechanism)  # an unknown or unimplemented mechanism: InvalidMechanismError
        privacy = PrivacyOptions(
            mechanism=mechanism, delta=delta, target_epsilon=target_epsilon, epochs=epochs, max_grad_norm=max_grad_norm,
            clipping=clipping, clipping_gamma=clipping_gamma, target_quantile=target_quantile, clipping_lr=clipping_lr,
            quantile_noise=quantile_noise, quantile_noise_law=quantile_noise_law,
            accountant=accountant, calibrate_with=calibrate_with, data_releases=data_releases,
            on_budget_exhausted=on_budget_exhausted, secure_mode=secure_mode,
            options=_options(mechanism, options, alpha=alpha, num_classes=num_classes),
            noise=noise_from_keywords(mechanism, required=False, noise=noise, noise_multiplier=noise_multiplier,
                                      laplace_scale=laplace_scale, concentration=concentration),
        )
        execution = ExecutionOptions(poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode,
                                     device=device, noise_shares=noise_shares,
                                     max_physical_batch_size=max_physical_batch_size,
                                     per_example_check=per_example_check)
        return self.make_private_with_options(module, optimizer, data_loader, privacy=privacy, execution=execution,
                                              loss_fn=loss_fn, privacy_unit=privacy_unit)

    def make_private_with_options(
        self, module: nn.Module, optimizer: Optimizer, data_loader: DataLoader, *, privacy: PrivacyOptions,
        execution: ExecutionOptions = ExecutionOptions(), loss_fn: Optional[LossFunction] = None,
        privacy_unit: Optional[Sequence[Hashable]] = None,
    ) -> tuple[nn.Module, Optimizer, DataLoader]:
        """:meth:`make_private` with its options as the two checked dataclasses: what is released
        (:class:`~dpnoise.training.privacy_plan.PrivacyOptions`) and how the run executes
        (:class:`~dpnoise.training.execution.ExecutionOptions`), e.g. both built once from a
        configuration; ``loss_fn`` and ``privacy_unit`` as in :meth:`make_private`."""
        if self.setup is not None:
            raise EngineStateError("this PrivacyEngine already made a model private; create a new one")
        run = check_private_run(module, optimizer, data_loader, privacy=privacy, execution=execution,
                                loss_fn=loss_fn, noise_seed=self.noise_seed, privacy_unit=privacy_unit)
        device, group, mech, poisson_sampling = run.device, run.group, run.mechanism, execution.poisson_sampling
        module.to(device)
        self.device, self.group = device, group
        if group is not None:  # one public seed for the run: rank 0's where no rank gave one
            seeds = group.gather_objects((self.seed, self._seed_given), "agreeing on the public seed")
            if not any(given for _, given in seeds):
                self.seed = seeds[0][0]
        self.randomness.start(self.device, self.rank, self.world_size)
        self.logical_batches = LogicalBatchTracker()
        if poisson_sampling:
            self.batch_provenance = BatchProvenance()
            module.register_forward_pre_hook(self.batch_provenance.observe_forward, with_kwargs=True)
        private_loader = training_loader(
            data_loader, poisson_sampling=poisson_sampling, device=self.device, float_dtype=module_float_dtype(module),
            generator=self.sampling_generator, shard=shard_indices(len(data_loader.dataset), self.rank, self.world_size),
            worker_seed=generator_seeds(self.seed, self.rank, self.world_size)[2], system_random=privacy.secure_mode,
            max_physical_batch_size=execution.max_physical_batch_size, tracker=self.logical_batches,
            provenance=self.batch_provenance, check=partial(check_keyword_batch, rules=run.batch_rules), units=run.units)
        sample_rate = getattr(private_loader, "sample_rate", data_loader.batch_size / len(data_loader.dataset))
        expected_batch_size = sample_rate * len(data_loader.dataset)
        self.plan = resolve(privacy, sample_rate=sample_rate, params=count_trainable_parameters(module),
                            expected_batch_size=expected_batch_size,
                            privacy_units=None if run.units is None else run.units.count)
        self.mechanism = mech
        if privacy.secure_mode:
            self.secure_plan = secure_noise_plan(self.setup, mech, module)
        if group is not None:
            group.check_same_setup({**asdict(self.setup), "noise_shares": execution.noise_shares, "seed": self.seed})
            group.broadcast_module(module)
        self.accountants = {name: accountant_holding(name, self.data_releases) for name in self.setup.accountants}
        self.ledger = StepLedger(self.plan.step_event, self.accountants, self.plan.max_steps,
                                 privacy.on_budget_exhausted,
                                 budget=f"epsilon={privacy.target_epsilon} (delta={self.setup.delta}, accountant "
                                        f"{self.setup.accountant})")
        clipping = run_clipping(self.setup, group, expected_batch_size, self.noise_generator)
        self.adaptive_clipping = clipping if isinstance(clipping, AdaptiveClipping) else None
        private_module, private_optimizer, source = wrap_private(
            module, optimizer, mechanism=mech, event=self.plan.step_event.event, clip=self.setup.clip,
            release=step_release(mech, self.setup.noise, self.setup.clip, self.noise_generator, self.secure_plan, group,
                                 execution.noise_shares) if mech.needs_per_sample_gradients else None,
            expected_batch_size=expected_batch_size, grad_sample_mode=execution.grad_sample_mode,
            gate=self.ledger, batches=self.step_batches, group=group, noise_shares=execution.noise_shares,
            generator=self.noise_generator, clipping=clipping)
        if source is not None:
            self.grad_sample_mode, self.gradient_sources = source.mode, source.sources
            private_optimizer.noisy_sum.privacy_units = run.units
        if execution.per_example_check and mech.needs_per_sample_gradients:
            private_optimizer.per_example_check = partial(self._check_per_example, private_module, loss_fn)
        accelerate_check = partial(check_accelerate_setup, self.device, self.world_size)
        for private in (private_module, private_loader):  # accelerate's prepare() leaves them as they are
            leave_to_dpnoise(private, accelerate_check)
        return private_module, private_optimizer, private_loader

    def _check_per_example(self, private_module: nn.Module, loss_fn: Optional[LossFunction], batch: Any) -> None:
        """The first batch's per-example check (on the run's device), its report kept in ``per_example_report``."""
        self.per_example_report = verify_per_example_gradients(
            private_module, to_device(batch, self.device, module_float_dtype(private_module)), loss_fn=loss_fn)

    @property
    def secure_noise(self) -> Optional[dict[str, Any]]:
        """Secure mode's release for the records (None outside secure mode): :func:`secure_noise_record`."""
        return None if self.secure_plan is None else secure_noise_record(self.secure_plan)

    @property
    def rank(self) -> int:
        """This process's rank (0 in one process)."""
        return 0 if self.group is None else self.group.rank

    @property
    def world_size(self) -> int:
        """The number of ranks K training together (1 in one process)."""
        return 1 if self.group is None else self.group.world_size

    private_randomness: str = Forwarded(
        "randomness", "source", None, '"secret" (seeded from the OS\'s entropy, the default) or "noise_seed" (reproducible).')
    noise_generator: Optional[torch.Generator] = Forwarded("randomness", "noise", None, "The noise generator.")
    sampling_generator: Optional[torch.Generator] = Forwarded(
        "randomness", "sampling", None, "The Poisson sampler's generator.")

    @property
    def step_batches(self) -> Union[BatchProvenance, LogicalBatchTracker]:
        """What the optimizers ask for each step's batch: the checked provenance (Poisson sampling), else
        the loader's last batch (shuffled batches, which the accountants do not cover anyway)."""
        return self.logical_batches if self.batch_provenance is None else self.batch_provenance

    def derived(self, source: torch.Tensor, derived: torch.Tensor) -> torch.Tensor:
        """Declare inputs computed in the training loop from a private batch's tensor (one row per example,
        e.g. an augmentation) as that batch's: ``module(engine.derived(x, augment(x)))``.  Without it a
        forward pass on them is refused at the step (:class:`ForeignBatchError`)."""
        if self.batch_provenance is None:
            raise EngineStateError("derived() needs make_private with Poisson sampling")
        return self.batch_provenance.derived(source, derived)

    # ----------------------------------------------------------------------------- accounting
    # the plan's and the ledger's facts, read where they live (None or empty before make_private)
    setup: Optional[PrivacySetup] = _in_plan("setup", None, "The run's privacy setup.")
    data_releases: tuple[DpEvent, ...] = _in_plan("releases", (), "Releases of the training data composed into every accountant before the first step.")
    planned_steps: Optional[int] = _in_plan("planned_steps", None, "ceil(epochs / q), the steps the calibration assumed (None without epochs).")
    calibration: Optional[CalibrationResult] = _in_plan("calibration", None, "The calibration that chose the noise (None: the noise was given).")
    step_event: Optional[DpEvent] = _in_ledger("step_event", None, "The DP event of one training step, built once by ``make_private``: every "
        "accountant composes it at every step; the budget and the checkpoint checks are computed from it.")
    steps: int = _in_ledger("steps", 0, "Steps recorded so far.", settable=True)
    max_steps: Optional[int] = _in_ledger("max_steps", None, "The most steps within the target budget (None: no budget).")
    budget_exhausted: bool = _in_ledger("budget_exhausted", False, "Whether a step was refused (or skipped) for the budget.", settable=True)
    budget_policy: BudgetPolicy = _in_ledger("policy", "raise", 'What a step past the budget does: "raise" or "stop".')

    def record_step(self) -> None:
        """Compose one step (:attr:`step_event`) into every accountant (what the optimizers do per step)."""
        self._set_up_ledger().record_step()

    def _set_up_ledger(self) -> StepLedger:
        if self.ledger is None:
            raise _no_steps_yet()
        return self.ledger

    @property
    def accountant(self) -> PrivacyAccountant:
        """The primary accountant (budget enforcement and :meth:`get_epsilon`)."""
        return self.accountants[self.setup.accountant]

    def get_epsilon(self, delta: Optional[float] = None) -> float:
        """Epsilon so far under the primary accountant (at ``delta``, default the target delta)."""
        return self.accountant.get_epsilon(self.setup.delta if delta is None else delta)

    def get_quick_epsilon(self, delta: Optional[float] = None) -> float:
        """A sound upper bound on :meth:`get_epsilon`, cheap enough for every step (progress, logs): equal to it
        for RDP accountants, the RDP routes only for the default minimum accountants."""
        return self.accountant.get_quick_epsilon(self.setup.delta if delta is None else delta)

    def epsilon_by_accountant(self, delta: Optional[float] = None) -> dict[str, float]:
        """Epsilon so far under every applicable accountant, e.g. ``{"lap2": .., "lap2-paper": ..}``
        (:meth:`StepLedger.epsilon_by_accountant`: ``ACCOUNTANTS[name].sound`` says which are proven bounds)."""
        return self._set_up_ledger().epsilon_by_accountant(self.setup.delta if delta is None else delta,
                                                          primary=self.setup.accountant)

    def adaptive_clipping_report(self, delta: Optional[float] = None) -> Optional[dict[str, float]]:
        """Adaptive clipping: the current C_t and, under the primary accountant at ``delta`` (default: the
        target's), the epsilon of this run's steps without their count releases (the data releases included)
        and that of the count releases alone (None for another clipping rule).  :meth:`get_epsilon` covers the
        two together, on the same Poisson batches, and is at least each of them."""
        if self.adaptive_clipping is None:
            return None
        delta = self.setup.delta if delta is None else delta
        gradients, count = self.plan.step_parts
        return {"final_clip": self.adaptive_clipping.clip,
                "epsilon_without_count": epsilon_of_events(self.setup.accountant, gradients, steps=self.steps,
                                                           delta=delta, releases=self.data_releases),
                "epsilon_of_count": epsilon_of_events(self.setup.accountant, count, steps=self.steps, delta=delta)}

    @property
    def scope_statement(self) -> Optional[str]:
        """What the epsilon covers when it is not the trained parameters (output mechanisms)."""
        return ACCOUNTANTS[self.setup.accountant].scope

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The engine's checkpoint state (:func:`~dpnoise.training.engine_state.capture_engine_state`).  In a
        process group it gathers the ranks' generators: call it on every rank."""
        own = self.randomness.saved(self.rank)
        ranks = [own] if self.group is None else self.group.gather_objects(own, "gathering the ranks' generators")
        state = capture_engine_state(self.resuming_run(), self.run_id, self._set_up_ledger(), ranks)
        return state if self.adaptive_clipping is None else {**state, "adaptive_clip": self.adaptive_clipping.clip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state saved by a run of this engine's setup and seed, after checking it: refused with
        :class:`CheckpointMismatchError` (one line naming the field), changing nothing, unless the state is this
        run's (:func:`~dpnoise.training.engine_state.check_engine_state` lists the checks).  The run identity
        (:attr:`run_id`) becomes the checkpoint's; each rank restores its own generators
        (:meth:`~dpnoise.training.randomness.PrivateRandomness.restore`: re-seeded, with a warning, where they
        were saved on another kind of device)."""
        if self.setup is None:
            raise EngineStateError("load_state_dict needs an engine set up by make_private (same setup as the checkpoint)")
        state = with_discrete_steps(state, self.resuming_run())
        self.check_state_dict(state)
        self.run_id = state["run_id"]
        self.steps = int(state["steps"])
        self.budget_exhausted = state["budget_exhausted"]
        for name, acc_state in state["accountants"].items():
            self.accountants[name].load_state_dict(acc_state)
        if self.adaptive_clipping is not None:  # the resumed run clips where the saved one stopped
            self.adaptive_clipping.clip = float(state["adaptive_clip"])
        reseeded = self.randomness.restore(state["generators"], self.device, self.rank, self.world_size, self.steps)
        if reseeded:
            warnings.warn(reseeded, stacklevel=2)

    def account_later_steps(self, steps_taken: int) -> None:
        """Count the steps this run took after the checkpoint just restored, which an explicitly accepted older
        checkpoint does not hold: the step counter and every accountant move on to ``steps_taken`` (so that every
        step the run ever took stays accounted, and the budget counts them), and the generators are re-seeded at
        that step (fresh draws, not a replay of the abandoned ones)."""
        steps_taken = check_count("steps_taken", steps_taken, 0)
        if steps_taken < self.steps:
            raise EngineStateError(f"steps_taken ({steps_taken}) is fewer than the steps restored ({self.steps})")
        self._set_up_ledger().account_later_steps(steps_taken)
        self.randomness.start(self.device, self.rank, self.world_size, resumed_at=steps_taken)

    def resuming_run(self) -> ResumingRun:
        """What a checkpoint of this run must agree with (:func:`~dpnoise.training.engine_state.check_engine_state`)."""
        return ResumingRun(self.setup, self.seed, self.private_randomness, self.max_steps, tuple(self.accountants),
                        self.data_releases, self.step_event, self.world_size, self.noise_seed, self.device)

    def check_state_dict(self, state: Any) -> None:
        """Raise :class:`CheckpointMismatchError` unless ``state`` is a consistent state of this run (the checks of
        :meth:`load_state_dict`, which changes nothing when they fail)."""
        check_engine_state(state, self.resuming_run())


def make_private(
    module: nn.Module, optimizer: Optimizer, data_loader: DataLoader, *, seed: Optional[int] = None,
    noise_seed: Optional[int] = None, **options: Any
) -> tuple[nn.Module, Optimizer, DataLoader]:
    """One-call form of :meth:`PrivacyEngine.make_private` (same options, plus the engine's ``seed``
    and ``noise_seed``: see :class:`PrivacyEngine`).

    The engine is reachable as ``optimizer.privacy_engine`` (``get_epsilon``,
    ``epsilon_by_accountant``, ``state_dict``).
    """
    engine = PrivacyEngine(seed=seed, noise_seed=noise_seed)
    private_module, private_optimizer, private_loader = engine.make_private(module, optimizer, data_loader, **options)
    private_optimizer.privacy_engine = engine
    return private_module, private_optimizer, private_loader
