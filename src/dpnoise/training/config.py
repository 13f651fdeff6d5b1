"""The configuration of a private training run (:func:`dpnoise.training.train_private`).

A :class:`TrainingConfig` groups what ``dpnoise train`` takes as flags: the data, the model, the
mechanism and its noise, the privacy target, the optimiser, the schedule, the output folder, the
device, the seed and the threads.  :func:`check_config` checks every field before any work and
raises :class:`InvalidConfigError`, whose message names the field by its dotted path
(``privacy.epsilon must be finite and > 0, got nan``); a front end that calls the fields
otherwise (the command line: its flags) renders the same message with its own names through
:meth:`InvalidConfigError.named`.

This module imports no torch (the package :mod:`dpnoise.training` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from dpnoise import checks
from dpnoise.accounting.validation import InvalidParameterError

#: learning rate of each optimiser when none is given
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}
#: models that take token ids (text datasets); every other model takes images
TEXT_MODELS = ("minilm", "minilm-features")
#: MiniLM-L6 has 512 positions; [CLS] and [SEP] take two
MAX_LENGTH_RANGE = (2, 512)
#: file name of the checkpoint written into the output folder after every epoch
CHECKPOINT_NAME = "checkpoint.pt"
#: devices a run can be given ("auto": CUDA when torch sees a GPU, else the CPU)
DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: who adds the noise in a distributed run: every rank one of K shares, or rank 0 all of it
NOISE_SHARES = ("split", "rank0")
#: learning-rate schedules over the planned steps: constant, or cosine decay to 0 (Loshchilov & Hutter, arXiv 1608.03983)
LR_SCHEDULES = ("constant", "cosine")
#: the splits a run can be evaluated on ("dev" where the dataset has one: sst2)
EVAL_SPLITS = ("test", "dev")
#: the mechanisms secure mode serves (``secure_mode``: exact integer noise from the OS's CSPRNG,
#: :mod:`dpnoise.mechanisms.secure_noise`): the gradient mechanisms whose noise is added to the clipped sum
SECURE_MODE_MECHANISMS = ("gaussian", "lap2", "laplace-l1")

#: renders a field's dotted path (``privacy.epsilon``) as a front end names it
Naming = Callable[[str], str]


class InvalidConfigError(InvalidParameterError):
    """An invalid :class:`TrainingConfig`: ``str(error)`` names the fields by their dotted paths,
    :meth:`named` by whatever ``naming`` maps a path to (e.g. the command line's flags)."""

    def __init__(self, describe: Callable[[Naming], str]) -> None:
        self._describe = describe
        super().__init__(describe(str))

    def named(self, naming: Naming) -> str:
        """The message with every field called ``naming(path)``."""
        return self._describe(naming)

    def __reduce__(self):  # the message survives pickling (process pools); the renaming does not
        return (InvalidParameterError, (str(self),))


def _as_path(config: object, name: str) -> None:
    """Store a path given as a string as a :class:`~pathlib.Path` (frozen dataclass field)."""
    value = getattr(config, name)
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, Path):
        object.__setattr__(config, name, Path(value))


@dataclass(frozen=True)
class DataConfig:
    """A packaged dataset (``dpnoise.data.DATASETS``) and its subsets."""

    name: str
    #: train on a deterministic class-balanced subset of this size
    limit: Optional[int] = None
    #: evaluate on a class-balanced test subset of this size
    test_limit: Optional[int] = None
    #: folder with the dataset files instead of the default place
    root: Optional[Path] = None
    #: token length for text datasets
    max_length: int = 64
    #: the split evaluated after every epoch: "test", or "dev" (sst2: GLUE's validation sentences)
    eval_split: str = "test"
    #: scatternet models: standardise the features with per-channel statistics released with Gaussian
    #: noise of this multiplier (:mod:`dpnoise.mechanisms.channel_statistics`; accounted with the
    #: training steps) instead of GroupNorm.  None: GroupNorm (no privacy cost)
    feature_statistics_noise: Optional[float] = None

    def __post_init__(self) -> None:
        _as_path(self, "root")


@dataclass(frozen=True)
class MechanismConfig:
    """The mechanism (``dpnoise.mechanisms.MECHANISMS``), its noise and clipping."""

    name: str
    #: the noise in the mechanism's own unit (see the mechanism registry,
    #: :data:`dpnoise.accounting.MECHANISMS`); None: calibrated from the privacy target
    noise: Optional[float] = None
    #: clipping norm C (unused by dirichlet)
    clip: float = 1.0
    #: Dirichlet offset (dirichlet only)
    alpha: float = 1.0
    #: per-example gradients of gradient mechanisms: "auto", "bookkeeping" or "hooks"
    grad_sample_mode: str = "auto"
    #: distributed runs (``torchrun``): "split" (every rank adds one of K noise shares) or "rank0"
    noise_shares: str = "split"


@dataclass(frozen=True)
class PrivacyTarget:
    """The budget: ``epsilon`` (None with a fixed ``MechanismConfig.noise``) at ``delta``."""

    delta: float
    #: calibrates the noise for the planned steps (unless the noise is given) and stops training
    #: before the budget is exceeded
    epsilon: Optional[float] = None
    #: primary accountant (budget and headline epsilon); None: the mechanism's sound default
    accountant: Optional[str] = None
    #: accountant that calibrates the noise (only with ``MechanismConfig.noise`` None: a given noise is
    #: not calibrated); None: the primary
    calibrate_with: Optional[str] = None


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser over the trainable parameters."""

    name: str = "adam"
    #: None: ``DEFAULT_LR[name]`` (or the Dirichlet heuristic with ``effective_lr``)
    lr: Optional[float] = None
    #: dirichlet only, instead of ``lr``: lr = effective_lr / kappa(s_y=0.9; r, alpha)
    effective_lr: Optional[float] = None
    #: SGD only (any other optimiser refuses a momentum other than 0)
    momentum: float = 0.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    #: "constant" or "cosine" (decays the lr to 0 over the planned steps)
    lr_schedule: str = "constant"
    #: evaluate an exponential moving average of the parameters with this decay (warmed up as
    #: min(decay, (1 + t) / (10 + t)) at step t); post-processing, no privacy cost.  None: no average
    ema_decay: Optional[float] = None


@dataclass(frozen=True)
class Schedule:
    """How long: ceil(epochs / q) Poisson-sampled steps at q = batch_size / N."""

    epochs: float
    #: expected (Poisson) batch size
    batch_size: int
    #: stop after this many steps in total (the noise is still calibrated for ``epochs``)
    max_steps: Optional[int] = None
    #: process each Poisson batch in physical batches of at most this many examples (clipped sums
    #: accumulated and noised once: the same step in less memory); None: one physical batch
    physical_batch_size: Optional[int] = None


@dataclass(frozen=True)
class OutputConfig:
    """Where the run's files go and where it resumes from."""

    #: metrics.json, steps.csv, epochs.csv, curves.png and a checkpoint after every epoch
    folder: Optional[Path] = None
    #: continue from a checkpoint written into an output folder
    resume: Optional[Path] = None
    #: a progress bar on stderr
    progress: bool = True

    def __post_init__(self) -> None:
        _as_path(self, "folder")
        _as_path(self, "resume")


@dataclass(frozen=True)
class TrainingConfig:
    """Everything a private training run needs (:func:`dpnoise.training.train_private`)."""

    data: DataConfig
    mechanism: MechanismConfig
    privacy: PrivacyTarget
    schedule: Schedule
    #: a name from ``dpnoise.models.MODELS``
    model: str = "cnn"
    #: minilm only: which of its parameters train (``dpnoise.models.TRAINABLE_PARTS``); None: last-block
    trainable: Optional[str] = None
    #: trainable "lora" only: the rank of the LoRA adapters; None: 8
    lora_rank: Optional[int] = None
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    #: public seed: model initialisation and data-loader workers (not the private randomness)
    seed: int = 0
    #: seed of the private randomness (the noise, the Poisson sampling, noisy statistics) for a
    #: reproducible run; None (default): secret, from the operating system's entropy
    #: (:mod:`dpnoise.training.randomness`)
    noise_seed: Optional[int] = None
    #: secure mode: the noise drawn exactly, in integers on a power-of-two grid, from the
    #: operating system's cryptographically secure generator (docs/theory/secure_noise.md); gradient
    #: mechanisms of SECURE_MODE_MECHANISMS only, one process, without noise_seed
    secure_mode: bool = False
    #: torch CPU threads (None: torch's choice)
    threads: Optional[int] = None
    #: where the model, batches, clipping, noise and sampler live: "auto" (CUDA when available), "cpu"
    #: or "cuda" (under ``torchrun``: each rank's ``cuda:LOCAL_RANK``)
    device: str = "auto"

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> "TrainingConfig":
        """A configuration from ``{dotted path: value}`` (``{"data.name": "digits", "seed": 0, ...}``);
        paths that are left out keep their defaults."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        top: dict[str, Any] = {}
        for path, value in values.items():
            group, _, name = path.rpartition(".")
            known = {f.name for f in fields(SECTIONS[group] if group in SECTIONS else cls)}
            if group not in ("", *SECTIONS) or name not in known or (not group and name in SECTIONS):
                raise InvalidParameterError(f"unknown configuration field {path!r}")
            (groups[group] if group else top)[name] = value
        return cls(**{name: SECTIONS[name](**group) for name, group in groups.items() if group}, **top)


#: the groups of a :class:`TrainingConfig` (field name -> its dataclass)
SECTIONS: dict[str, type] = {"data": DataConfig, "mechanism": MechanismConfig, "privacy": PrivacyTarget,
                             "schedule": Schedule, "optimizer": OptimizerConfig, "output": OutputConfig}


def check_field(path: str, check: str, value: Any, *extra: Any) -> Any:
    """``dpnoise.checks.<check>(path, value, *extra)``; its error becomes an :class:`InvalidConfigError`
    (whose :meth:`~InvalidConfigError.named` runs the check again under the other name)."""
    try:
        return getattr(checks, check)(path, value, *extra)
    except InvalidParameterError:
        def describe(naming: Naming) -> str:
            try:
                getattr(checks, check)(naming(path), value, *extra)
            except InvalidParameterError as err:
                return str(err)
            raise AssertionError("a check refused a value once and accepted it the second time")

        raise InvalidConfigError(describe) from None


def _optional(path: str, check: str, value: Any, *extra: Any) -> Any:
    return None if value is None else check_field(path, check, value, *extra)


def check_config(config: TrainingConfig) -> None:
    """Check every field that needs no registry (finite, in range, paths usable) before any work.

    The checks that need the dataset sizes or the mechanism's accountants are in
    :func:`dpnoise.training.preparation.check_against_registries`.
    """
    if not isinstance(config, TrainingConfig):
        raise InvalidConfigError(lambda n: f"the configuration must be a TrainingConfig, got {type(config).__name__}")
    for section, kind in SECTIONS.items():
        value = getattr(config, section)
        if not isinstance(value, kind):
            raise InvalidConfigError(lambda n, section=section, kind=kind, value=value:
                                     f"{n(section)} must be a {kind.__name__}, got {value!r}")
    data, mech, privacy, opt, schedule, out = (config.data, config.mechanism, config.privacy, config.optimizer,
                                               config.schedule, config.output)
    if privacy.epsilon is None and mech.noise is None:
        raise InvalidConfigError(lambda n: f"give {n('privacy.epsilon')} (calibrate the noise) or "
                                           f"{n('mechanism.noise')} (fixed noise), or both")
    if opt.effective_lr is not None and (mech.name != "dirichlet" or opt.lr is not None):
        raise InvalidConfigError(lambda n: f"{n('optimizer.effective_lr')} applies to {n('mechanism.name')} "
                                           f"dirichlet without {n('optimizer.lr')}")
    _optional("privacy.epsilon", "check_positive", privacy.epsilon)
    _optional("mechanism.noise", "check_positive", mech.noise)
    check_field("privacy.delta", "check_delta", privacy.delta)
    check_field("mechanism.clip", "check_positive", mech.clip)
    check_field("mechanism.alpha", "check_positive", mech.alpha)
    check_field("schedule.epochs", "check_positive", schedule.epochs)
    check_field("schedule.batch_size", "check_count", schedule.batch_size, 1)
    _optional("optimizer.lr", "check_positive", opt.lr)
    _optional("optimizer.effective_lr", "check_positive", opt.effective_lr)
    check_field("optimizer.momentum", "fraction", opt.momentum)
    check_field("optimizer.weight_decay", "nonnegative", opt.weight_decay)
    check_field("optimizer.label_smoothing", "fraction", opt.label_smoothing)
    _optional("schedule.max_steps", "check_count", schedule.max_steps, 1)
    _optional("schedule.physical_batch_size", "check_count", schedule.physical_batch_size, 1)
    _optional("optimizer.ema_decay", "open_fraction", opt.ema_decay)
    _optional("data.limit", "check_count", data.limit, 1)
    _optional("data.test_limit", "check_count", data.test_limit, 1)
    _optional("data.feature_statistics_noise", "check_positive", data.feature_statistics_noise)
    check_field("data.max_length", "count_in", data.max_length, *MAX_LENGTH_RANGE)
    check_field("seed", "seed", config.seed)
    _optional("noise_seed", "seed", config.noise_seed)
    _optional("lora_rank", "check_count", config.lora_rank, 1)
    _optional("threads", "check_count", config.threads, 1)
    _optional("data.root", "existing_folder", data.root)
    _optional("output.folder", "output_folder", out.folder)
    _optional("output.resume", "checkpoint_file", out.resume)
    if opt.name not in DEFAULT_LR:
        raise InvalidConfigError(lambda n: f"{n('optimizer.name')} must be one of {', '.join(DEFAULT_LR)}, "
                                           f"got {opt.name!r}")
    if opt.momentum != 0 and opt.name != "sgd":  # refused rather than silently ignored
        raise InvalidConfigError(lambda n: f"{n('optimizer.momentum')} applies to {n('optimizer.name')} sgd only, "
                                           f"got {opt.momentum!r} with {opt.name!r}")
    if config.lora_rank is not None and config.trainable != "lora":
        raise InvalidConfigError(lambda n: f"{n('lora_rank')} applies to {n('trainable')} lora only")
    check_secure_mode(config)
    if privacy.calibrate_with is not None and mech.noise is not None:
        raise InvalidConfigError(lambda n: f"{n('privacy.calibrate_with')} applies only when the noise is "
                                           f"calibrated: give {n('privacy.epsilon')} without {n('mechanism.noise')}")
    for path, value, choices in (("device", config.device, DEVICE_CHOICES),
                                 ("mechanism.noise_shares", mech.noise_shares, NOISE_SHARES),
                                 ("optimizer.lr_schedule", opt.lr_schedule, LR_SCHEDULES),
                                 ("data.eval_split", data.eval_split, EVAL_SPLITS)):
        if value not in choices:
            raise InvalidConfigError(lambda n, path=path, value=value, choices=choices:
                                     f"{n(path)} must be one of {', '.join(choices)}, got {value!r}")


def check_secure_mode(config: TrainingConfig) -> None:
    """``secure_mode`` is True or False, and with True: a mechanism of SECURE_MODE_MECHANISMS, no
    ``noise_seed`` (secure noise cannot be reproducible) and no feature statistics (released with
    floating-point noise, which secure mode does not cover)."""
    secure = config.secure_mode
    if not isinstance(secure, bool):
        raise InvalidConfigError(lambda n: f"{n('secure_mode')} must be True or False, got {secure!r}")
    if not secure:
        return
    mechanism = config.mechanism.name
    if mechanism not in SECURE_MODE_MECHANISMS:
        raise InvalidConfigError(lambda n: f"{n('secure_mode')} serves {n('mechanism.name')} "
                                           f"{', '.join(SECURE_MODE_MECHANISMS)}, got {mechanism!r}")
    if config.noise_seed is not None:
        raise InvalidConfigError(lambda n: f"{n('secure_mode')} draws noise nobody can reproduce; it cannot be "
                                           f"combined with {n('noise_seed')}")
    if config.data.feature_statistics_noise is not None:
        raise InvalidConfigError(lambda n: f"{n('secure_mode')} does not cover {n('data.feature_statistics_noise')} "
                                           "(its statistics are released with floating-point noise)")
