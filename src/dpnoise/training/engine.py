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
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnoise import checks
from dpnoise.accounting import (
    ACCOUNTANTS,
    CalibrationResult,
    PrivacyAccountant,
    UnsoundAccountantWarning,
    accountant_holding,
    MechanismOptions,
    noise_from_keywords,
)
from dpnoise.accounting.events import DpEvent
from dpnoise.accounting.validation import check_count
from dpnoise.mechanisms.registry import Mechanism, get_mechanism
from dpnoise.mechanisms.release import FloatRelease, GridRelease, Release
from dpnoise.mechanisms.secure_noise import Plan
from dpnoise.training.batches import LossFunction, check_keyword_batch
from dpnoise.training.devices import DeviceLike, module_float_dtype, seeded_generator, to_device
from dpnoise.training.distributed import RankGroup, generator_seeds
from dpnoise.training.engine_state import ResumingRun, check_engine_state, with_discrete_steps
from dpnoise.training.execution import ExecutionOptions, GradSampleMode
from dpnoise.training.randomness import PrivateRandomness, ReproducibleNoiseWarning, reproducible_noise_warning
from dpnoise.training.errors import EngineStateError
from dpnoise.training.optimizers import (
    DistributedNoisyGradientOptimizer,
    DistributedOutputPrivateOptimizer,
    NoisyGradientOptimizer,
    OutputPrivateOptimizer,
    noise_share,
)
from dpnoise.training.privacy_plan import (
    PrivacyOptions,
    option_keywords,
    PrivacyPlan,
    PrivacySetup,
    resolve,
)
from dpnoise.training.per_example_check import PerExampleCheckReport, verify_per_example_gradients
from dpnoise.training.provenance import BatchProvenance
from dpnoise.training.secure_mode import secure_noise_plan, secure_noise_record
from dpnoise.training.sampling import DeviceDataLoader, LogicalBatchTracker, poisson_loader, shard_indices
from dpnoise.training.step_ledger import BudgetPolicy, StepLedger
from dpnoise.training.validation import check_private_run
from dpnoise.training.wrapping import choose_gradient_source

logger = logging.getLogger(__name__)



def count_trainable_parameters(module: nn.Module) -> int:
    """Number of trainable scalars (the dimension n of the gradient noise)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class _Forwarded:
    """An engine attribute kept for users that lives in the engine's ``owner`` (its plan or its step ledger):
    ``getattr(engine.<owner>, name)``, or ``empty`` while the owner is None (before ``make_private``);
    ``settable`` ones are set on the owner (refused before ``make_private``)."""

    def __init__(self, owner: str, name: str, empty: Any, doc: str, settable: bool = False) -> None:
        self.owner, self.name, self.empty, self.settable, self.__doc__ = owner, name, empty, settable, doc

    def __get__(self, engine: Optional["PrivacyEngine"], kind: Optional[type] = None) -> Any:
        if engine is None:
            return self
        holder = getattr(engine, self.owner)
        return self.empty if holder is None else getattr(holder, self.name)

    def __set__(self, engine: "PrivacyEngine", value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{self.name} is read-only: it belongs to the engine's {self.owner}")
        holder = getattr(engine, self.owner)
        if holder is None:
            raise EngineStateError("the engine has no steps before make_private")
        setattr(holder, self.name, value)


class PrivacyEngine:
    """Makes a model, optimizer and data loader private and tracks the privacy spent.

    Randomness (:mod:`dpnoise.training.randomness`): the engine owns two private generators, one
    for the Poisson sampler and one for the mechanism's noise, created by ``make_private`` on the
    run's device.  By default they are seeded from the operating system's entropy, differently on
    every rank, and their seeds are never stored: no one can regenerate the batches or the noise.
    ``noise_seed`` makes them reproducible (:class:`ReproducibleNoiseWarning`: whoever knows it can
    remove the noise).  The public ``seed`` drives the data-loader workers' seeds only; in a process
    group where no rank gave one, every rank takes rank 0's (the private randomness stays each rank's own).  The
    generators are ordinary torch generators (Mersenne Twister), not cryptographically secure.
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
    ) -> tuple[nn.Module, Optimizer, DataLoader]:
        """Return the private (module, optimizer, data loader).

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
            mechanism: a name from :data:`dpnoise.accounting.MECHANISMS`.
            delta: the target delta.
            noise / noise_multiplier / laplace_scale / concentration: the noise in the mechanism's unit,
                as ``noise`` or under the keyword of that unit and only that one (see the registry):
                ``noise_multiplier`` sigma (noise std sigma * C) for ``gaussian`` and
                ``penultimate-gaussian``, ``laplace_scale`` b (absolute) for ``lap2`` and ``laplace-l1``,
                ``concentration`` r for ``dirichlet``.  Omit it to calibrate from ``target_epsilon`` and
                ``epochs``.
            target_epsilon: the budget. Steps past it are refused (``on_budget_exhausted``).
            epochs: planned epochs (needed to calibrate ``noise``); ``planned_steps`` becomes
                ceil(epochs / sample_rate), the step count the calibration assumed.
            max_grad_norm: clipping norm C (L2; L1 for ``laplace-l1``; activations for
                ``penultimate-gaussian``; unused by ``dirichlet``).
            options: the mechanism's side parameters, its options dataclass
                (:attr:`~dpnoise.accounting.MechanismSpec.options`, e.g. ``DirichletOptions``); or their
                fields as keywords, for the Dirichlet mechanism:
            alpha: Dirichlet offset (``dirichlet`` only; default 1.0).
            num_classes: the number of classes of the model's outputs (``dirichlet`` only; None: not
                recorded).  Recorded in every step's event: with 2 the default accountant has its exact
                two-class route; a training output of another size is refused.
            accountant: the primary accountant (budget and ``get_epsilon``); default: the first
                of ``accountants_for_mechanism``. All applicable accountants are recorded.
            calibrate_with: accountant used to calibrate the noise (default: the primary); refused with a
                given noise, which nothing calibrates.
            poisson_sampling: True (default) builds Opacus's Poisson ``DPDataLoader``; False keeps
                shuffled fixed-size batches, which the accountants do NOT cover (warned).
            on_budget_exhausted: ``"raise"`` (:class:`PrivacyBudgetExceededError`) or ``"stop"``
                (the step is skipped, ``budget_exhausted`` becomes True).
            grad_sample_mode: how gradient mechanisms get per-example gradients: ``"hooks"``
                (Opacus's ``GradSampleModule``, every layer materialised), ``"bookkeeping"``
                (:class:`~dpnoise.training.bookkeeping.BookkeepingModule`: dense layers clipped
                without materialising; same clipped sums, faster) or ``"auto"`` (default:
                bookkeeping when every trainable layer supports it, else hooks).
            device: where the model, batches, clipping, noise and sampler live: "cpu", "cuda" (or
                "cuda:i"), or "auto" (CUDA when available); default: the module's device.  The
                model is moved there; floating-point batches are cast to the model's dtype.
            noise_shares: in a process group of K > 1 ranks (every rank calls ``make_private`` with
                the whole data set and the same options), who adds the noise: ``"split"`` (default:
                every rank adds one of K independent shares, so that no rank draws the total noise)
                or ``"rank0"`` (rank 0 adds all of it); docs/DISTRIBUTED.md says what either hides
                from the ranks (they are trusted, as one process is).  The optimizer and the model must then be
                used on every rank in step; ``save_checkpoint`` too.  Ignored in one process.
            max_physical_batch_size: logical batches larger than memory allows: the loader yields
                each Poisson batch (one accounted step) in physical batches of at most this many
                examples; ``optimizer.step()`` after a physical batch that does not end its logical
                batch only clips and accumulates (no noise, no update, no accounting), and after
                the last one it noises the whole clipped sum once and takes the step.  The usual
                loop (``zero_grad``, forward, ``backward``, ``step`` per batch) needs no change.
                Default: one physical batch per logical batch.
            data_releases: DP releases of the training data made before training, as mechanism events
                (or compositions of them) without subsampling, under add/remove adjacency; a
                ``PoissonSampledEvent`` is refused even at sampling probability 1, since the
                accountants count those as training steps (e.g. ``ChannelStatistics.event`` of
                :func:`~dpnoise.mechanisms.channel_statistics.private_channel_statistics`, the noisy
                statistics a model's input is standardised with).  Every accountant composes them
                before the first step, the calibration and the budget cover them and the steps
                together, and checkpoints record them.  Gradient mechanisms only (the output
                mechanisms' epsilon has another scope and adjacency).
            secure_mode: release each step's clipped sum as ``grid * (round(S / grid) + Z)``, Z exact
                integer noise drawn from the operating system's cryptographically secure generator (the
                Poisson batches too: each example in when a uniform 64-bit integer from it is below q 2^64)
                (floored Laplace for ``lap2`` and ``laplace-l1``, the discrete Gaussian for
                ``gaussian``; docs/theory/secure_noise.md), so that neither the noise nor the
                floating-point bits of the released gradients reveal anything.  The noise is raised
                by the factor C'/C of the sum's rounding (``secure_noise``: grid and factor, at most
                1 + 2^-10 by default); Laplace epsilons are unchanged, the Gaussian's carry the
                discrete Gaussian's correction (far below double precision, rounded up) in
                ``get_epsilon``, ``get_quick_epsilon``, ``epsilon_by_accountant`` and the budget
                (``engine.accountant`` itself reports the continuous mechanism).  The noise is
                computed on the CPU (its cost: benchmarks/README.md).  Refused for other mechanisms,
                with the engine's ``noise_seed``, in a process group of K > 1 ranks, without Poisson
                sampling and for parameters whose dtype cannot hold the grid.
            loss_fn: the training loss ``loss_fn(logits, labels)``, the mean over the batch's examples, as the
                training loop computes it (None: the model's own ``outputs.loss`` for dict batches, the
                cross-entropy for pairs); what the per-example check differentiates.  A Hugging Face causal
                language model needs ``loss_fn=dpnoise.training.causal_lm_loss`` (its ``outputs.loss`` is the
                mean over the batch's tokens, which mixes the examples: refused).
            per_example_check: gradient mechanisms: at the first physical batch of at least 2 examples (in a
                process group, at every rank's first physical batch, the ranks agreeing), before any noise,
                the engine's per-example gradients of a few examples are compared with one-example-at-a-time
                autograd of ``loss_fn``, and shown unchanged when another example of the batch is replaced (:func:`~dpnoise.training.verify_per_example_gradients`, dropout off for the
                check); a mismatch raises :class:`~dpnoise.training.PerExampleCheckError` naming the parameter,
                and every later step repeats the check.  Its report is ``per_example_report``.  False skips it
                (warned).
        """
        # Every argument is checked here, before any work (errors name the parameter).
        if self.setup is not None:
            raise EngineStateError("this PrivacyEngine already made a model private; create a new one")
        get_mechanism(mechanism)  # an unknown or unimplemented mechanism: InvalidMechanismError
        privacy = PrivacyOptions(
            mechanism=mechanism, delta=delta, target_epsilon=target_epsilon, epochs=epochs, max_grad_norm=max_grad_norm,
            accountant=accountant, calibrate_with=calibrate_with, data_releases=data_releases,
            on_budget_exhausted=on_budget_exhausted, secure_mode=secure_mode,
            options=option_keywords(options, alpha=alpha, num_classes=num_classes),
            noise=noise_from_keywords(mechanism, required=False, noise=noise, noise_multiplier=noise_multiplier,
                                      laplace_scale=laplace_scale, concentration=concentration),
        )
        execution = ExecutionOptions(poisson_sampling=poisson_sampling, grad_sample_mode=grad_sample_mode,
                                     device=device, noise_shares=noise_shares,
                                     max_physical_batch_size=max_physical_batch_size,
                                     per_example_check=per_example_check)
        return self.make_private_with_options(module, optimizer, data_loader, privacy=privacy, execution=execution,
                                              loss_fn=loss_fn)

    def make_private_with_options(
        self, module: nn.Module, optimizer: Optimizer, data_loader: DataLoader, *, privacy: PrivacyOptions,
        execution: ExecutionOptions = ExecutionOptions(), loss_fn: Optional[LossFunction] = None,
    ) -> tuple[nn.Module, Optimizer, DataLoader]:
        """:meth:`make_private` with its options as the two checked dataclasses: what is released
        (:class:`~dpnoise.training.privacy_plan.PrivacyOptions`) and how the run executes
        (:class:`~dpnoise.training.execution.ExecutionOptions`), e.g. both built once from a
        configuration; ``loss_fn`` as in :meth:`make_private`."""
        if self.setup is not None:
            raise EngineStateError("this PrivacyEngine already made a model private; create a new one")
        run = check_private_run(module, optimizer, data_loader, privacy=privacy, execution=execution,
                                loss_fn=loss_fn, noise_seed=self.noise_seed)
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
        private_loader = self._private_loader(data_loader, poisson_sampling, float_dtype=module_float_dtype(module),
                                              system_random=privacy.secure_mode,
                                              max_physical_batch_size=execution.max_physical_batch_size,
                                              check=partial(check_keyword_batch, rules=run.batch_rules))
        sample_rate = self._sample_rate(private_loader, data_loader)
        self.plan = resolve(privacy, sample_rate=sample_rate, params=count_trainable_parameters(module))
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
        private_module, private_optimizer = self._wrap(
            module, optimizer, expected_batch_size=sample_rate * len(data_loader.dataset),
            grad_sample_mode=execution.grad_sample_mode, noise_shares=execution.noise_shares,
        )
        if execution.per_example_check and mech.needs_per_sample_gradients:
            private_optimizer.per_example_check = partial(self._check_per_example, private_module, loss_fn)
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

    private_randomness: str = _Forwarded(
        "randomness", "source", None, '"secret" (seeded from the OS\'s entropy, the default) or "noise_seed" (reproducible).')
    noise_generator: Optional[torch.Generator] = _Forwarded("randomness", "noise", None, "The noise generator.")
    sampling_generator: Optional[torch.Generator] = _Forwarded(
        "randomness", "sampling", None, "The Poisson sampler's generator.")

    def _private_loader(self, data_loader: DataLoader, poisson_sampling: bool, float_dtype: Optional[torch.dtype],
                        system_random: bool, max_physical_batch_size: Optional[int],
                        check: Callable[[Any], None]) -> DeviceDataLoader:
        """Poisson loader of this rank's shard with the engine's sampling generator, or the OS's CSPRNG
        (``system_random``: secure mode), or shuffled batches (warned); its batches checked by ``check``,
        on the run's device, split into physical batches if asked."""
        dataset = data_loader.dataset
        common = dict(collate_fn=data_loader.collate_fn, num_workers=data_loader.num_workers, check=check)
        if not poisson_sampling:
            warnings.warn(
                "poisson_sampling=False: batches are shuffled fixed-size batches, but the "
                "accountants assume Poisson sampling; the reported epsilon does not cover this run",
                stacklevel=3,
            )
            return DeviceDataLoader(dataset, device=self.device, float_dtype=float_dtype,
                                    batch_size=data_loader.batch_size, shuffle=True,
                                    generator=self.sampling_generator, **common)
        # The DataLoader draws a worker base seed from its own generator at every new pass; it is
        # not the sampler's, so that the sampler's draws do not depend on pass boundaries (this is
        # what makes a resumed run identical to an uninterrupted one).
        worker_seed = generator_seeds(self.seed, self.rank, self.world_size)[2]
        return poisson_loader(dataset, sample_rate=data_loader.batch_size / len(dataset),
                              shard=shard_indices(len(dataset), self.rank, self.world_size),
                              generator=self.sampling_generator, device=self.device, float_dtype=float_dtype,
                              worker_generator=seeded_generator(worker_seed),
                              max_physical_batch_size=max_physical_batch_size, tracker=self.logical_batches,
                              provenance=self.batch_provenance, system_random=system_random,
                              **common)

    def _release(self, noise_shares: str) -> Release:
        """How each step's clipped sums are noised: secure mode's grid release, else the mechanism's float
        noise from the engine's noise generator (this rank's share of it in a process group)."""
        if self.secure_plan is not None:
            return GridRelease(self.secure_plan)
        shares, adds_share = noise_share(self.group, noise_shares)
        return FloatRelease(self.mechanism.sample_noise, self.setup.noise, self.setup.clip, self.noise_generator,
                            shares, adds_share)

    @staticmethod
    def _sample_rate(private_loader: DataLoader, data_loader: DataLoader) -> float:
        """The Poisson rate the loader really uses (batch_size / N for fixed batches)."""
        return getattr(private_loader, "sample_rate", data_loader.batch_size / len(data_loader.dataset))

    def _wrap(self, module: nn.Module, optimizer: Optimizer, expected_batch_size: float,
              grad_sample_mode: GradSampleMode, noise_shares: str) -> tuple[nn.Module, Optimizer]:
        """The private module and optimizer (the distributed ones inside a process group)."""
        mech, setup, group = self.mechanism, self.setup, self.group
        if mech.needs_per_sample_gradients:
            source = choose_gradient_source(module, grad_sample_mode)
            private_module, grad_sample_mode = source.module, source.mode
            self.grad_sample_mode, self.gradient_sources = source.mode, source.sources
            options = dict(
                mechanism=mech,
                release=self._release(noise_shares),
                max_grad_norm=setup.clip,
                expected_batch_size=expected_batch_size,
                gate=self.ledger,
                logical_batches=self.step_batches,
                bookkeeping=private_module if grad_sample_mode == "bookkeeping" else None,
            )
            if group is None:
                return private_module, NoisyGradientOptimizer(optimizer, **options)
            return private_module, DistributedNoisyGradientOptimizer(optimizer, group=group,
                                                                     noise_shares=noise_shares, **options)
        private_module = mech.wrap_module(module, self.plan.step_event.event, clip=setup.clip,
                                          generator=self.noise_generator)
        options = dict(gate=self.ledger, logical_batches=self.step_batches, module=private_module)
        if group is None:
            return private_module, OutputPrivateOptimizer(optimizer, **options)
        return private_module, DistributedOutputPrivateOptimizer(optimizer, group=group, **options)

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
    setup: Optional[PrivacySetup] = _Forwarded("plan", "setup", None, "The run's privacy setup.")
    data_releases: tuple[DpEvent, ...] = _Forwarded(
        "plan", "releases", (), "Releases of the training data composed into every accountant before the first step.")
    planned_steps: Optional[int] = _Forwarded(
        "plan", "planned_steps", None, "ceil(epochs / q), the steps the calibration assumed (None without epochs).")
    calibration: Optional[CalibrationResult] = _Forwarded(
        "plan", "calibration", None, "The calibration that chose the noise (None: the noise was given).")
    step_event: Optional[DpEvent] = _Forwarded(
        "ledger", "step_event", None, "The DP event of one training step, built once by ``make_private``: every "
        "accountant composes it at every step; the budget and the checkpoint checks are computed from it.")
    steps: int = _Forwarded("ledger", "steps", 0, "Steps recorded so far.", settable=True)
    max_steps: Optional[int] = _Forwarded(
        "ledger", "max_steps", None, "The most steps within the target budget (None: no budget).")
    budget_exhausted: bool = _Forwarded(
        "ledger", "budget_exhausted", False, "Whether a step was refused (or skipped) for the budget.", settable=True)
    budget_policy: BudgetPolicy = _Forwarded(
        "ledger", "policy", "raise", 'What a step past the budget does: "raise" or "stop".')

    def record_step(self) -> None:
        """Compose one step (:attr:`step_event`) into every accountant (what the optimizers do per step)."""
        self._set_up_ledger().record_step()

    def _set_up_ledger(self) -> StepLedger:
        if self.ledger is None:
            raise EngineStateError("the engine has no steps before make_private")
        return self.ledger

    @property
    def accountant(self) -> PrivacyAccountant:
        """The primary accountant (budget enforcement and :meth:`get_epsilon`)."""
        return self.accountants[self.setup.accountant]

    def get_epsilon(self, delta: Optional[float] = None) -> float:
        """Epsilon so far under the primary accountant (at ``delta``, default the target delta)."""
        return self.accountant.get_epsilon(self.setup.delta if delta is None else delta)

    def get_quick_epsilon(self, delta: Optional[float] = None) -> float:
        """A sound upper bound on :meth:`get_epsilon`, cheap enough for every step (progress, logs).

        Equal to it for RDP accountants; for the default minimum accountants it uses their RDP
        routes only (see ``PrivacyAccountant.get_quick_epsilon``).
        """
        return self.accountant.get_quick_epsilon(self.setup.delta if delta is None else delta)

    def epsilon_by_accountant(self, delta: Optional[float] = None) -> dict[str, float]:
        """Epsilon so far under every applicable accountant, e.g. ``{"lap2": .., "lap2-paper": ..}``.

        An unsound accountant warns only when it is the primary one, which the user chose
        (``accountant=``); recorded side by side, its value comes without a warning
        (``ACCOUNTANTS[name].sound`` says which values are proven bounds).
        """
        delta = self.setup.delta if delta is None else delta
        by_accountant = {}
        for name, acc in self.accountants.items():
            with warnings.catch_warnings():
                if name != self.setup.accountant:
                    warnings.simplefilter("ignore", UnsoundAccountantWarning)
                by_accountant[name] = acc.get_epsilon(delta)
        return by_accountant

    @property
    def scope_statement(self) -> Optional[str]:
        """What the epsilon covers when it is not the trained parameters (output mechanisms)."""
        return ACCOUNTANTS[self.setup.accountant].scope

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Run identity, setup, seed, step count, budget flag, accountant states (plain data, JSON-able) and,
        with a ``noise_seed``, every rank's generator states (byte tensors) with their tags (for checkpoints;
        secret randomness is not saved).  In a process group it gathers the ranks' generators: call it on
        every rank."""
        own = self.randomness.saved(self.rank)
        ranks = [own] if self.group is None else self.group.gather_objects(own, "gathering the ranks' generators")
        return {
            "run_id": self.run_id,
            "setup": asdict(self.setup),
            "seed": self.seed,
            "private_randomness": self.private_randomness,
            "steps": self.steps,
            "budget_exhausted": self.budget_exhausted,
            "accountants": {name: acc.state_dict() for name, acc in self.accountants.items()},
            "generators": {"device": self.device.type, "ranks": ranks},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state saved by a run of this engine's setup and seed, after checking it.

        Refused with :class:`CheckpointMismatchError` (one line naming the field), changing
        nothing, unless:

        * its privacy setup equals this engine's, field by field, and its seed is ``self.seed``;
        * its step counter k is an integer with 0 <= k <= ``max_steps`` (when there is a budget),
          and ``budget_exhausted`` is set only once k reached ``max_steps``;
        * it holds exactly this engine's accountants, and the state of each one equals the state
          of a fresh accountant of that name holding the run's data releases (``accountant_holding``,
          as in ``make_private``) after ``compose(step_event, k)``: a ledger
          cannot be shortened, emptied
          or recorded with other noise without contradicting the step counter or the setup;
        * it holds the generators of as many ranks as this run has (resume with the same K);
        * its private randomness is this run's: secret (no generator state saved; the resumed run
          draws fresh secret seeds) or from the same ``noise_seed``, every saved generator state
          carrying the tag that binds it to that seed (a replaced state is refused).

        The run identity (:attr:`run_id`) becomes the checkpoint's: the resumed run is the same run.
        Each rank restores its own generators.  Saved on another kind of device (CPU vs CUDA, whose
        generators differ), they cannot be restored: the generators are then re-seeded from the
        seed, the rank and the step (:func:`~dpnoise.training.distributed.generator_seeds`), a
        fresh stream, and a warning says that the run continues with other draws than an
        uninterrupted one.  Checkpoints written before distributed training (no ``generators``)
        hold one CPU rank's ``noise_generator`` and ``sampling_generator``.

        The ledger check assumes that k single steps leave an accountant in the same state as one
        ``compose(step_event, k)`` (true of every registered accountant: consecutive equal events
        are merged; the accountant contract test checks it for each).
        """
        if self.setup is None:
            raise EngineStateError("load_state_dict needs an engine set up by make_private (same setup as the checkpoint)")
        state = with_discrete_steps(state, self.resuming_run())
        self.check_state_dict(state)
        self.run_id = state["run_id"]
        self.steps = int(state["steps"])
        self.budget_exhausted = state["budget_exhausted"]
        for name, acc_state in state["accountants"].items():
            self.accountants[name].load_state_dict(acc_state)
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
        for accountant in self.accountants.values():
            accountant.compose(self.step_event, steps_taken - self.steps)
        self.steps = steps_taken
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
