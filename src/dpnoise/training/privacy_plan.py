"""A run's privacy, resolved without torch: the options in; the step's DP event, the accountants, the
planned steps and the budget out.

``make_private`` is two halves.  This module is the first: :class:`PrivacyOptions` (frozen, keyword-only,
checked when built: every error names its option; also the ``privacy`` section of a
:class:`~dpnoise.training.config.TrainingConfig`, whose fields declare their command-line flags) and :func:`resolve`, a pure function of the options
and two facts about the data and the model (the sample rate q and the number n of trained parameters)
that returns the :class:`PrivacyPlan`: the setup a checkpoint must match, the DP event of one step, the
noise (given, or calibrated to the target), the planned steps and the most steps within the budget.
The second half, :class:`~dpnoise.training.engine.PrivacyEngine`, is the torch side: the Poisson
loader that gives q, the per-example gradients, the noise and the optimizer, which compose the plan's
step event into the accountants at every step.

    plan = resolve(PrivacyOptions(mechanism="lap2", delta=1e-5, target_epsilon=1.0, epochs=2),
                   sample_rate=256 / 60000, params=26010)
    plan.setup.noise, plan.step_event, plan.max_steps
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from dpnoise.accounting import (
    ACCOUNTANTS,
    MECHANISMS,
    CalibrationResult,
    MechanismOptions,
    MechanismSpec,
    RunFacts,
    UnsoundAccountantWarning,
    accountant_holding,
    accountants_for_mechanism,
    epsilon_of_events,
    get_mechanism_spec,
    steps_from_epochs,
    training_step_event,
)
from dpnoise import checks
from dpnoise.accounting.adaptive_clipping import COUNT_NOISE_LAWS, adaptive_step_event, count_event
from dpnoise.accounting.events import (
    EVENT_TYPES,
    ComposedEvent,
    DiscreteGaussianStepEvent,
    DpEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_to_dict,
)
from dpnoise.accounting.secure_noise import SMOOTHING, discrete_gaussian_budget
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_accounted,
    check_delta,
    check_positive,
    check_sample_rate,
)
from dpnoise.training.calibration import calibrate_training_noise, steps_within_budget
from dpnoise.training.errors import InvalidTrainingOptionError, PrivacyBudgetExceededError
from dpnoise.training.options import OPTIMISATION, PRIVACY, RUN, FieldValue, Rule, broken_rule, option
from dpnoise.training.step_ledger import BudgetPolicy

#: the per-example clipping rules (:func:`~dpnoise.mechanisms.clipping.clipping_rule`; adaptive:
#: :class:`~dpnoise.mechanisms.clipping.AdaptiveClipping`)
CLIPPING = ("flat", "automatic", "adaptive")
#: automatic clipping's gamma where none is given (Bu et al.'s)
DEFAULT_CLIPPING_GAMMA = 0.01
#: adaptive clipping's defaults where none is given (Andrew et al., arXiv 1905.03871): the median, the learning
#: rate eta_C of the geometric update, a Gaussian count
ADAPTIVE_DEFAULTS = {"target_quantile": 0.5, "clipping_lr": 0.2, "quantile_noise_law": "gaussian"}
#: the count's default noise sigma_b is the expected batch size over this (Andrew et al.'s recommendation)
QUANTILE_NOISE_BATCH_DIVISOR = 20
#: the options of adaptive clipping only
ADAPTIVE_OPTIONS = ("target_quantile", "clipping_lr", "quantile_noise", "quantile_noise_law")

#: the mechanisms secure mode serves (``secure_mode``: exact integer noise from the OS's CSPRNG,
#: :mod:`dpnoise.mechanisms.secure_noise`): the gradient mechanisms whose noise is added to the clipped sum, those
#: whose MechanismSpec names a secure_noise sampler
SECURE_MODE_MECHANISMS = tuple(sorted(name for name, spec in MECHANISMS.items() if spec.secure_noise is not None))


@dataclass(frozen=True)
class PrivacySetup:
    """The privacy options of a run, fixed at ``make_private`` (what a checkpoint must match); the
    accountants are told :attr:`PrivacyPlan.step_event`, built from them once."""

    mechanism: str
    noise: float
    clip: float
    sample_rate: float
    params: int
    delta: float
    target_epsilon: Optional[float]
    accountant: str
    accountants: tuple[str, ...]
    #: releases of the training data composed before the first step (``event_to_dict`` of each)
    data_releases: tuple[dict[str, Any], ...] = ()
    #: secure mode: exact integer noise on a grid (the Gaussian's epsilons carry its correction)
    secure_mode: bool = False
    #: the mechanism's side parameters (:meth:`~dpnoise.accounting.MechanismOptions.to_dict`; e.g. the Dirichlet
    #: alpha and number of classes)
    options: dict[str, Any] = field(default_factory=dict)
    #: the per-example clipping rule and, for automatic clipping, its gamma
    clipping: str = "flat"
    clipping_gamma: Optional[float] = None
    #: the number of privacy units, whose examples are sampled and clipped together
    #: (:mod:`dpnoise.training.privacy_units`; None: each example is its own unit)
    privacy_units: Optional[int] = None
    #: adaptive clipping's target quantile, learning rate, count noise and its law (None: another rule);
    #: ``clip`` is then the initial C_0, the one the noise is calibrated to
    target_quantile: Optional[float] = None
    clipping_lr: Optional[float] = None
    quantile_noise: Optional[float] = None
    quantile_noise_law: Optional[str] = None

    @property
    def mechanism_options(self) -> MechanismOptions:
        """:attr:`options` as the mechanism's options dataclass."""
        return get_mechanism_spec(self.mechanism).make_options(**self.options)


@dataclass(frozen=True, kw_only=True)
class PrivacyOptions:
    """The privacy options of ``make_private`` (same names and meaning), checked when built: every error
    names its option.  ``primary`` and ``accountants`` are derived: the primary accountant (``accountant``,
    else the mechanism's default) and every accountant the run records, the primary first.  The fields with
    a command-line flag declare it (:func:`~dpnoise.training.options.option`); the mechanism's options have
    generated flags; ``data_releases`` and ``on_budget_exhausted`` have none (a training run sets them).

    Attributes:
        mechanism: a name from :data:`dpnoise.accounting.MECHANISMS`.
        delta: the target delta.
        noise: the noise in the mechanism's unit (``make_private`` also takes it under the keyword of that
            unit and only that one, see the registry):
            ``noise_multiplier`` sigma (noise std sigma * C) for ``gaussian`` and
            ``penultimate-gaussian``, ``laplace_scale`` b (absolute) for ``lap2`` and ``laplace-l1``,
            ``concentration`` r for ``dirichlet``.  Omit it to calibrate from ``target_epsilon`` and
            ``epochs``.
        target_epsilon: the budget. Steps past it are refused (``on_budget_exhausted``).
        epochs: planned epochs (needed to calibrate ``noise``); ``planned_steps`` becomes
            ceil(epochs / sample_rate), the step count the calibration assumed.
        max_grad_norm: clipping norm C (L2; L1 for ``laplace-l1``; activations for
            ``penultimate-gaussian``; unused by ``dirichlet``).
        clipping: gradient mechanisms: ``"flat"`` (default: each example's gradient scaled by
            min(1, C / ||g||)) or ``"automatic"`` (C g / (||g|| + gamma), Bu et al., arXiv 2206.07136): both
            bound each example's contribution by C, so the accountants are the same.  Or ``"adaptive"`` (Andrew et al., arXiv 1905.03871): flat clipping to a C_t that follows a quantile of
            the gradient norms, C_{t+1} = C_t exp(-clipping_lr (b_t - target_quantile)), b_t the noisy fraction
            of each batch's examples with norm <= C_t; the noise follows C_t (std sigma C_t, Laplace scale
            b C_t / C_0) and ``max_grad_norm`` is C_0.  Every step then also releases that noisy count,
            accounted with the gradient sum (docs/ACCOUNTING.md, "Adaptive clipping").
        clipping_gamma: automatic clipping's gamma (default 0.01).
        target_quantile: adaptive clipping's target quantile of the gradient norms, in (0, 1) (default 0.5).
        clipping_lr: adaptive clipping's learning rate eta_C > 0 of C's geometric update (default 0.2).
        quantile_noise: adaptive clipping's count noise: the std sigma_b of a Gaussian count, or the scale of a
            Laplace one (the count has sensitivity 1); default: expected batch size / 20 (Andrew et al.).
        quantile_noise_law: ``"gaussian"`` (default) or ``"laplace"`` (for ``lap2`` and ``laplace-l1``).
        options: the mechanism's side parameters, as its options dataclass
            (:attr:`~dpnoise.accounting.MechanismSpec.options`, e.g. ``DirichletOptions(alpha=0.5)``) or a
            mapping of its fields (``{"alpha": 0.5}``), stored as the dataclass (default: its defaults);
            a field the mechanism does not take is refused.  The Dirichlet mechanism's: ``alpha``, its offset
            (default 1.0), and ``num_classes``, the number of classes of the model's outputs (None: not
            recorded), recorded in every step's event: with 2 the default accountant has its exact two-class
            route; a training output of another size is refused (``make_private`` takes both as keywords).
        accountant: the primary accountant (budget and ``get_epsilon``); default: the first
            of ``accountants_for_mechanism``. All applicable accountants are recorded.
        calibrate_with: accountant used to calibrate the noise (default: the primary); refused with a
            given noise, which nothing calibrates.
        on_budget_exhausted: ``"raise"`` (:class:`PrivacyBudgetExceededError`) or ``"stop"``
            (the step is skipped, ``budget_exhausted`` becomes True).
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
            ``get_epsilon``, ``get_quick_epsilon``, ``epsilon_by_accountant``, the accountants and the
            budget.  The noise is computed on the CPU (its cost: benchmarks/README.md).  Refused for other mechanisms,
            with the engine's ``noise_seed``, in a process group of K > 1 ranks, without Poisson
            sampling and for parameters whose dtype cannot hold the grid.
    """

    mechanism: str = option(flag="--mechanism", group=PRIVACY, required=True,
                            registry="dpnoise.mechanisms.RUNNABLE_MECHANISMS", choices=lambda: tuple(sorted(MECHANISMS)),
                            help="{mechanisms}. Output mechanisms protect the released outputs, not the parameters "
                            "(docs/theory/dirichlet.md §5)")
    noise: Optional[float] = option(None, flag="--noise", group=PRIVACY, check=("check_positive",),
                                    help="fixed noise instead of calibrating; {noise_units}")
    max_grad_norm: float = option(1.0, flag="--clip", group=PRIVACY, check=("check_accounted",),
                                  help="clipping norm C: per-example gradient L2 norm (gaussian, lap2), L1 norm "
                                  "(laplace-l1), or penultimate activation L2 norm; unused by dirichlet (default 1)")
    delta: float = option(flag="--delta", group=PRIVACY, check=("check_delta",),
                          help="target delta, e.g. 1e-5 (required unless a --recipe sets it)")
    target_epsilon: Optional[float] = option(None, flag="--epsilon", group=PRIVACY, check=("check_positive",),
                                             help="target epsilon: calibrates the noise for --epochs (unless --noise "
                                             "is given) and stops training before the budget is exceeded")
    #: the planned length: the noise is calibrated for ceil(epochs / q) steps (a training run's length)
    epochs: Optional[float] = option(None, flag="--epochs", group=OPTIMISATION, check=("check_positive",), needed=True,
                                     help="epochs E; the run takes ceil(E / q) Poisson-sampled steps, q = batch/N "
                                     "(required unless a --recipe sets it)")
    #: None: the mechanism's sound default
    accountant: Optional[str] = option(None, flag="--accountant", group=PRIVACY, metavar="NAME",
                                       help="primary accountant (budget and headline epsilon); default: the sound "
                                       "default of the mechanism. All applicable ones are reported. One of: "
                                       "{accountants}")
    #: only with ``noise`` None (a given noise is not calibrated); None: the primary
    calibrate_with: Optional[str] = option(None, flag="--calibrate-with", group=PRIVACY, metavar="NAME",
                                           help="accountant used to calibrate the noise to --epsilon (default: the "
                                           "primary; refused with --noise, where nothing is calibrated); "
                                           "'lap2-paper' is allowed for reproducing the Lap2 paper but warned: it is "
                                           "not a valid bound")
    #: gradient mechanisms of SECURE_MODE_MECHANISMS only, one process, without the engine's noise seed
    secure_mode: bool = option(
        False, flag="--secure-mode", group=RUN,
        help="floating-point-safe noise nobody can predict (" + ", ".join(SECURE_MODE_MECHANISMS) + "): each step "
        "releases grid * (round(S / grid) + Z), S the clipped sum rounded onto a power-of-two grid, Z exact integer "
        "noise (floored Laplace; the discrete Gaussian of Canonne, Kamath & Steinke) drawn with integer arithmetic "
        "from the operating system's cryptographically secure generator, so that neither the noise nor the low bits "
        "of the released gradients reveal the data (docs/theory/secure_noise.md). The noise is raised by the "
        "rounding's factor C'/C (at most 1 + 2^-10, reported with the grid); Laplace epsilons are unchanged, Gaussian "
        "ones carry the discrete Gaussian's correction (far below double precision, rounded up). The noise is drawn "
        "on the CPU: it adds tens of milliseconds to a step of the tutorial CNN and 10 to 25 s to one of MiniLM full "
        "fine-tuning (benchmarks/README.md). One process only; refused with --noise-seed and "
        "--feature-statistics-noise")
    #: gradient mechanisms: how each example's gradient is bounded by C (Bu et al., arXiv 2206.07136, for automatic)
    clipping: str = option("flat", flag="--clipping", group=PRIVACY, choices=CLIPPING,
                           help="gradient mechanisms: flat (default: each example's gradient scaled by min(1, C / "
                           "||g||)) or automatic (every gradient normalised, C g / (||g|| + gamma): no threshold to "
                           "tune but C, which then only scales the learning rate; Bu et al. 2022); both bound each "
                           "example's contribution by C, so the epsilon is the same. Or adaptive (flat clipping to a "
                           "C that follows --target-quantile of the gradient norms through a noisy count each step, "
                           "the noise following C; --clip is the starting C; Andrew et al. 2021): the counts are "
                           "accounted with the gradients")
    #: automatic clipping only; None: DEFAULT_CLIPPING_GAMMA
    clipping_gamma: Optional[float] = option(None, flag="--clipping-gamma", group=PRIVACY, check=("check_positive",),
                                             help="automatic clipping: the gamma of C g / (||g|| + gamma) (default "
                                             "0.01)")
    #: adaptive clipping only (Andrew et al., arXiv 1905.03871); None: ADAPTIVE_DEFAULTS
    target_quantile: Optional[float] = option(None, flag="--target-quantile", group=PRIVACY, check=("open_fraction",),
                                              help="adaptive clipping: the quantile of the per-example gradient "
                                              "norms C follows, in (0, 1) (default 0.5, the median)")
    clipping_lr: Optional[float] = option(None, flag="--clipping-lr", group=PRIVACY, check=("check_positive",),
                                          help="adaptive clipping: the learning rate eta_C of C <- C exp(-eta_C "
                                          "(b - quantile)), b the noisy fraction of the batch with norm <= C "
                                          "(default 0.2)")
    quantile_noise: Optional[float] = option(None, flag="--quantile-noise", group=PRIVACY, check=("check_positive",),
                                             help="adaptive clipping: the noise on each step's count of examples "
                                             "with norm <= C (sensitivity 1): the std sigma_b of a Gaussian count, "
                                             "or the scale of a Laplace one; accounted with the gradient noise "
                                             "(default: expected batch size / 20)")
    quantile_noise_law: Optional[str] = option(None, flag="--quantile-noise-law", group=PRIVACY,
                                               choices=COUNT_NOISE_LAWS,
                                               help="adaptive clipping: the count's noise, gaussian (default) or "
                                               "laplace (lap2 and laplace-l1 only)")
    #: the command line's flags for these are generated from every mechanism's options dataclass
    #: (:func:`~dpnoise.accounting.mechanisms.option_fields`)
    options: Any = field(default_factory=dict)
    data_releases: tuple[DpEvent, ...] = ()
    on_budget_exhausted: BudgetPolicy = "raise"
    primary: str = field(init=False)
    accountants: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        spec = get_mechanism_spec(self.mechanism)
        checked = dict(delta=check_delta("delta", self.delta),
                       max_grad_norm=check_accounted("max_grad_norm", self.max_grad_norm))
        noise_keyword = spec.noise.keyword
        if self.noise is not None:
            checked["noise"] = spec.check_noise(self.noise, self.max_grad_norm, clip_name="max_grad_norm")
        if self.target_epsilon is not None:
            checked["target_epsilon"] = check_positive("target_epsilon", self.target_epsilon)
        if self.epochs is not None:
            checked["epochs"] = check_positive("epochs", self.epochs)
        broken = broken_rule(PRIVACY_RULES, lambda name: getattr(self, name))
        if broken is not None:
            keyword = {"noise": noise_keyword}
            raise InvalidTrainingOptionError(broken.message(lambda name: keyword.get(name, name),
                                                            lambda name: getattr(self, name)))
        try:
            checked["options"] = mechanism_options(spec, self.options)
        except InvalidParameterError as err:
            raise InvalidTrainingOptionError(str(err)) from None
        if self.clipping == "automatic" and self.clipping_gamma is None:
            checked["clipping_gamma"] = DEFAULT_CLIPPING_GAMMA
        if self.clipping == "adaptive":
            checked.update(checked_adaptive_options(self))
        if self.on_budget_exhausted not in ("raise", "stop"):
            raise InvalidTrainingOptionError(
                f"on_budget_exhausted must be 'raise' or 'stop', got {self.on_budget_exhausted!r}")
        if not isinstance(self.secure_mode, bool):
            raise InvalidTrainingOptionError(f"secure_mode must be True or False, got {self.secure_mode!r}")
        primary, accountants = chosen_accountants(self.mechanism, self.accountant)
        checked.update(primary=primary, accountants=accountants,
                       data_releases=checked_releases(self.data_releases, self.mechanism, accountants))
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def mechanism_options(spec: MechanismSpec, options: Any, naming: Callable[[str], str] = str) -> MechanismOptions:
    """``options`` (the mechanism's options dataclass, or a mapping of its fields) as ``spec``'s options
    dataclass; ``naming`` names a field in an error."""
    if isinstance(options, Mapping):
        return spec.make_options(naming=naming, **options)
    return spec.make_options(options)


def _inapplicable_accountant(field: str) -> Rule:
    """``field`` (``accountant`` or ``calibrate_with``) names an accountant of the mechanism, or its options."""
    def applicable(value_at: FieldValue) -> tuple[str, ...]:
        return accountants_for_mechanism(value_at("mechanism"), include_options=True)

    return Rule(lambda v: v(field) is not None and v(field) not in applicable(v),
                lambda n, v: f"{n(field)} {v(field)!r} does not apply to {n('mechanism')} {v('mechanism')}; choose "
                             f"from {', '.join(applicable(v))}")


#: the checks across the privacy options (the mechanism already known), run by ``PrivacyOptions`` and, on a
#: configuration's ``privacy`` fields, by :func:`~dpnoise.training.config.check_fields`
PRIVACY_RULES: tuple[Rule, ...] = (
    Rule(lambda v: v("noise") is None and (v("target_epsilon") is None or v("epochs") is None),
         lambda n, v: f"give {n('noise')} (fixed noise), or {n('target_epsilon')} and {n('epochs')} (to calibrate "
                      f"the noise)"),
    Rule(lambda v: v("noise") is not None and v("calibrate_with") is not None,  # refused rather than ignored
         lambda n, v: f"{n('calibrate_with')} applies only when the noise is calibrated: give {n('target_epsilon')} "
                      f"without {n('noise')}"),
    _inapplicable_accountant("accountant"),
    _inapplicable_accountant("calibrate_with"),
    Rule(lambda v: v("clipping") not in CLIPPING,
         lambda n, v: f"{n('clipping')} must be one of {', '.join(CLIPPING)}, got {v('clipping')!r}"),
    Rule(lambda v: v("clipping") != "flat" and MECHANISMS[v("mechanism")].perturbs != "gradients",
         lambda n, v: f"{n('clipping')} {v('clipping')} applies to the gradient mechanisms, not to {v('mechanism')}"),
    Rule(lambda v: v("clipping_gamma") is not None and v("clipping") != "automatic",
         lambda n, v: f"{n('clipping_gamma')} applies to {n('clipping')} automatic only"),
    *(Rule(lambda v, name=name: v(name) is not None and v("clipping") != "adaptive",
           lambda n, v, name=name: f"{n(name)} applies to {n('clipping')} adaptive only") for name in ADAPTIVE_OPTIONS),
    Rule(lambda v: v("quantile_noise_law") == "laplace" and MECHANISMS[v("mechanism")].noise_distribution != "laplace",
         lambda n, v: f"{n('quantile_noise_law')} laplace applies to the Laplace mechanisms (lap2, laplace-l1), not "
                      f"to {v('mechanism')}: its count is released with Gaussian noise"),
    # the count's noise is drawn from the float noise generator, which secure mode replaces
    Rule(lambda v: v("clipping") == "adaptive" and v("secure_mode"),
         lambda n, v: f"{n('clipping')} adaptive is not available with {n('secure_mode')}"),
)


def checked_adaptive_options(options: "PrivacyOptions") -> dict[str, Any]:
    """Adaptive clipping's options, checked (each error names its option) and defaulted
    (:data:`ADAPTIVE_DEFAULTS`; the count noise stays None until the expected batch size is known)."""
    checked = {name: getattr(options, name) if getattr(options, name) is not None else default
               for name, default in ADAPTIVE_DEFAULTS.items()}
    try:
        checked["target_quantile"] = checks.open_fraction("target_quantile", checked["target_quantile"])
        checked["clipping_lr"] = check_positive("clipping_lr", checked["clipping_lr"])
        if options.quantile_noise is not None:
            checked["quantile_noise"] = check_positive("quantile_noise", options.quantile_noise)
    except InvalidParameterError as err:
        raise InvalidTrainingOptionError(str(err)) from None
    return checked


def default_quantile_noise(expected_batch_size: Optional[float]) -> float:
    """Andrew et al.'s count noise sigma_b = expected batch size / 20 (arXiv 1905.03871, Sec. 3)."""
    if expected_batch_size is None:
        raise InvalidTrainingOptionError("adaptive clipping needs quantile_noise (Andrew et al. recommend the "
                                         "expected batch size / 20)")
    return check_positive("expected batch size", expected_batch_size) / QUANTILE_NOISE_BATCH_DIVISOR


def chosen_accountants(mechanism: str, accountant: Optional[str]) -> tuple[str, tuple[str, ...]]:
    """(primary accountant, all recorded accountants, the primary first); ``accountant`` and ``calibrate_with``
    already checked (:data:`PRIVACY_RULES`)."""
    recorded = accountants_for_mechanism(mechanism)
    primary = accountant or recorded[0]
    return primary, tuple(dict.fromkeys([primary, *recorded]))


def checked_releases(data_releases: Any, mechanism: str, accountants: tuple[str, ...]) -> tuple[DpEvent, ...]:
    """``data_releases`` as a tuple, after checking that they are DP events every accountant can compose."""
    if not isinstance(data_releases, (list, tuple)):
        raise InvalidTrainingOptionError(f"data_releases must be a list or tuple of DP events, got "
                                         f"{type(data_releases).__name__}")
    releases = tuple(data_releases)
    if releases and get_mechanism_spec(mechanism).scope is not None:
        raise InvalidTrainingOptionError(f"data_releases are accounted for gradient mechanisms only; {mechanism!r} "
                                         f"is an output mechanism (its epsilon covers its outputs)")
    for release in releases:
        if not isinstance(release, tuple(EVENT_TYPES.values())) or holds_sampling(release):
            raise InvalidTrainingOptionError(f"data_releases must be DP events of the whole data set (no "
                                             f"Poisson sampling: the mechanism's event itself, not a "
                                             f"PoissonSampledEvent, which is a training step), got {release!r}")
        for name in accountants:
            try:
                accountant_holding(name, (release,))
            except (InvalidParameterError, NotImplementedError) as err:
                raise InvalidTrainingOptionError(f"data_releases: accountant {name!r} cannot account "
                                                 f"{release!r}: {err}") from None
    return releases


def holds_sampling(event: DpEvent) -> bool:
    """Whether ``event`` is or contains a ``PoissonSampledEvent`` (a training step, not a data release)."""
    if isinstance(event, PoissonSampledEvent):
        return True
    if isinstance(event, SelfComposedEvent):
        return holds_sampling(event.event)
    if isinstance(event, ComposedEvent):
        return any(holds_sampling(inner) for inner in event.events)
    return False


@dataclass(frozen=True)
class PrivacyPlan:
    """What :func:`resolve` decides: everything about a run's privacy that torch plays no part in."""

    setup: PrivacySetup
    #: the DP event of one training step (every accountant composes it at every step): a Poisson-sampled
    #: mechanism event, wrapped in a DiscreteGaussianStepEvent where secure mode releases it on a grid
    step_event: DpEvent
    releases: tuple[DpEvent, ...]
    #: ceil(epochs / q), the steps the calibration assumed (None without epochs)
    planned_steps: Optional[int]
    #: the calibration that chose the noise (None: the noise was given)
    calibration: Optional[CalibrationResult]
    #: the most steps within the target budget (None: no target)
    max_steps: Optional[int]
    on_budget_exhausted: BudgetPolicy
    #: adaptive clipping: the step's two releases, each alone on the step's Poisson subsample (the gradient
    #: sum's, then the count's), for reporting the count's own cost; None: one release per step
    step_parts: Optional[tuple[DpEvent, DpEvent]] = None


def _discrete_gaussian(mechanism: str, secure_mode: bool) -> bool:
    return secure_mode and get_mechanism_spec(mechanism).secure_noise == "discrete-gaussian"


def check_step_count(epochs: Optional[float], sample_rate: float) -> None:
    """Refuse ``epochs`` whose step count epochs / q overflows (naming ``epochs``)."""
    if epochs is not None and not math.isfinite(epochs / sample_rate):
        raise InvalidTrainingOptionError(f"epochs={epochs:g} at sample rate {sample_rate:g} is an unbounded number "
                                         f"of steps")


def resolve(options: PrivacyOptions, *, sample_rate: float, params: int,
            expected_batch_size: Optional[float] = None, privacy_units: Optional[int] = None) -> PrivacyPlan:
    """The run's :class:`PrivacyPlan` at sample rate ``sample_rate`` with ``params`` trained parameters
    (``privacy_units``: the number of privacy units, ``sample_rate`` a unit's).

    Adaptive clipping: every step also releases the noisy count (its noise ``quantile_noise``, default
    ``expected_batch_size`` / 20), so the step event is the two releases on one Poisson subsample
    (:func:`~dpnoise.accounting.adaptive_clipping.adaptive_step_event`), which the calibration and the budget
    cover.

    The noise is ``options.noise``, or the smallest one whose epsilon after the planned steps (and the
    data releases) meets the target under ``calibrate_with`` (default: the primary accountant); the
    budget is the most steps whose reported epsilon stays within the target under the primary.
    Raises :class:`PrivacyBudgetExceededError` when not even one step fits, and
    ``UnreachableTargetError`` when no noise meets the target; warns when ``accountant`` or
    ``calibrate_with`` is an unsound accountant (:class:`UnsoundAccountantWarning`).
    """
    for name in dict.fromkeys((options.accountant, options.calibrate_with)):
        if name is not None and not ACCOUNTANTS[name].sound:
            warnings.warn(ACCOUNTANTS[name].warning, UnsoundAccountantWarning, stacklevel=3)
    sample_rate = check_sample_rate("sample_rate", sample_rate)
    check_step_count(options.epochs, sample_rate)
    planned_steps = None if options.epochs is None else steps_from_epochs(options.epochs, sample_rate)
    adaptive = {}
    if options.clipping == "adaptive":
        adaptive = {name: getattr(options, name) for name in ADAPTIVE_OPTIONS}
        if adaptive["quantile_noise"] is None:
            adaptive["quantile_noise"] = default_quantile_noise(expected_batch_size)
    count = count_event(adaptive["quantile_noise_law"], adaptive["quantile_noise"]) if adaptive else None
    noise, calibration = options.noise, None
    if noise is None:
        target = (options.target_epsilon, options.delta)
        if _discrete_gaussian(options.mechanism, options.secure_mode):  # its correction must fit too
            target = discrete_gaussian_budget(options.target_epsilon, options.delta, planned_steps, params)
        calibration = calibrate_training_noise(
            options.calibrate_with or options.primary, target_epsilon=target[0], delta=target[1],
            sample_rate=sample_rate, steps=planned_steps, clip=options.max_grad_norm, params=params,
            options=options.options, releases=options.data_releases, count_release=count)
        noise = calibration.noise
    setup = PrivacySetup(
        mechanism=options.mechanism, noise=float(noise), clip=float(options.max_grad_norm),
        sample_rate=float(sample_rate), params=params, delta=float(options.delta),
        target_epsilon=options.target_epsilon, accountant=options.primary, accountants=options.accountants,
        data_releases=tuple(event_to_dict(release) for release in options.data_releases),
        secure_mode=options.secure_mode, options=options.options.to_dict(), clipping=options.clipping,
        clipping_gamma=options.clipping_gamma, privacy_units=privacy_units, **adaptive,
    )
    step_event = training_step_event(options.mechanism, sample_rate=sample_rate, noise=noise,
                                     facts=RunFacts(clip=options.max_grad_norm, params=params), options=options.options)
    step_parts = None
    if count is not None:
        step_parts = (step_event, PoissonSampledEvent(step_event.sampling_probability, count))
        step_event = adaptive_step_event(step_event.sampling_probability, step_event.event, count)
    if _discrete_gaussian(options.mechanism, options.secure_mode):  # released on a grid: its accountants correct
        step_event = DiscreteGaussianStepEvent(step_event, params, SMOOTHING)
    plan = PrivacyPlan(setup, step_event, options.data_releases, planned_steps, calibration, None,
                       options.on_budget_exhausted, step_parts)
    if options.target_epsilon is None:
        return plan
    max_steps = steps_within_budget(options.primary, step_event, options.target_epsilon, options.delta,
                                    options.data_releases, start=planned_steps or 1)
    if max_steps == 0:
        spent = ""
        if options.data_releases:
            alone = epsilon_of_events(options.primary, step_event, steps=0, delta=options.delta,
                                      releases=options.data_releases)
            spent = f"; the data_releases alone cost {alone:.4g}"
        raise PrivacyBudgetExceededError(
            f"epsilon {options.target_epsilon} is below what even one step costs with noise {noise} "
            f"(accountant {options.primary}, delta {options.delta}{spent}); increase the budget or the noise")
    return replace(plan, max_steps=max_steps)
