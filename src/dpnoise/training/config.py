"""The configuration of a private training run (:func:`dpnoise.training.train_private`).

A :class:`TrainingConfig` groups what ``dpnoise train`` takes as flags: the data, the model, the
mechanism and its noise, the privacy target, the optimiser, the schedule, the output folder, the
device, the seed and the threads.  Each field is declared once, here: its :func:`option` metadata
holds its command-line flag, help, check and choices, from which the command line builds its
parser (:data:`OPTIONS`) and :func:`check_config` its per-field checks.  :func:`check_config`
checks every field before any work and raises :class:`InvalidConfigError`, whose message names the
field by its dotted path (``privacy.epsilon must be finite and > 0, got nan``); a front end that
calls the fields otherwise (the command line: its flags) renders the same message with its own
names through :meth:`InvalidConfigError.named`.

This module imports no torch (nor does the package :mod:`dpnoise.training` until one of its
torch-side names is used).
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union, get_args, get_origin, get_type_hints

from dpnoise import checks
from dpnoise.accounting import MECHANISMS
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.training.execution import NOISE_SHARES

#: learning rate of each optimiser when none is given
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}
#: models that take token ids (text datasets); every other model takes images
TEXT_MODELS = ("minilm", "minilm-features")
#: MiniLM-L6 has 512 positions; [CLS] and [SEP] take two
MAX_LENGTH_RANGE = (2, 512)
#: the image sides the EfficientNet models accept (``resolution``)
RESOLUTION_RANGE = (32, 512)
#: file name of the checkpoint written into the output folder after every epoch
CHECKPOINT_NAME = "checkpoint.pt"
#: devices a run can be given ("auto": CUDA when torch sees a GPU, else the CPU)
DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: learning-rate schedules over the planned steps: constant, or cosine decay to 0 (Loshchilov & Hutter, arXiv 1608.03983)
LR_SCHEDULES = ("constant", "cosine")
#: the splits a run can be evaluated on ("dev" where the dataset has one: sst2)
EVAL_SPLITS = ("test", "dev")


def effective_lr_mechanisms() -> list[str]:
    """The mechanisms whose learning rate may be given as an effective one (``MechanismSpec.effective_lr``)."""
    return [name for name, spec in MECHANISMS.items() if spec.effective_lr]


def effective_lr_applies(mechanism: str) -> bool:
    return mechanism in MECHANISMS and MECHANISMS[mechanism].effective_lr


#: the mechanisms secure mode serves (``secure_mode``: exact integer noise from the OS's CSPRNG,
#: :mod:`dpnoise.mechanisms.secure_noise`): the gradient mechanisms whose noise is added to the clipped sum, those
#: whose MechanismSpec names a secure_noise sampler
SECURE_MODE_MECHANISMS = tuple(sorted(name for name, spec in MECHANISMS.items() if spec.secure_noise is not None))

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


@dataclass(frozen=True)
class Option:
    """How a configuration field is given on the command line and checked (its :func:`option` metadata).

    ``check`` is the name of a :mod:`dpnoise.checks` function and its extra arguments, run as
    ``check(name, value, *extra)`` by :func:`check_config` and, on the options given, by the command line
    before any work.  ``choices`` are the values accepted; where they come from a registry that imports
    torch, ``registry`` names it (``"dpnoise.data.DATASETS"``): the registry is the truth, checked by
    :func:`~dpnoise.training.preparation.check_against_registries`, and ``choices`` its torch-free copy for
    the command line (a test checks that they agree).  ``help`` may name ``{mechanisms}``,
    ``{noise_units}`` and ``{accountants}``, which the command line fills in from the mechanism and
    accountant registries.  ``path``, ``type`` and ``default`` are those of the declaring field
    (:data:`OPTIONS`).
    """

    flag: str
    help: str
    #: the heading the command line lists the flag under (one of :data:`OPTION_GROUPS`)
    group: str
    check: tuple[Any, ...] = ()
    #: the values, or a function giving them when the command line is built (a registry that grows)
    choices: Union[tuple[str, ...], Callable[[], tuple[str, ...]], None] = None
    registry: Optional[str] = None
    metavar: Optional[str] = None
    #: the command line needs the flag (a field without a default may instead come from a ``--recipe``)
    required: bool = False
    #: the declaring field's dotted path, its type (``Optional`` removed) and its default (None: "not given")
    path: str = ""
    type: Any = None
    default: Any = None

    def allowed(self) -> Optional[tuple[str, ...]]:
        """The accepted values now (None: any value that passes the check)."""
        return self.choices() if callable(self.choices) else self.choices


def option(default: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field whose metadata is ``Option(**declared)`` (no ``default``: a required field)."""
    return field(default=default, metadata={"option": Option(**declared)})


_WHAT, _PRIVACY, _OPTIMISATION, _RUN = "what to train", "privacy", "optimisation", "run"
#: the headings the command line lists the options under (:attr:`Option.group`), in this order
OPTION_GROUPS = (_WHAT, _PRIVACY, _OPTIMISATION, _RUN)


def _as_path(config: object, name: str) -> None:
    """Store a path given as a string as a :class:`~pathlib.Path` (frozen dataclass field)."""
    value = getattr(config, name)
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, Path):
        object.__setattr__(config, name, Path(value))


@dataclass(frozen=True)
class DataConfig:
    """A packaged dataset (``dpnoise.data.DATASETS``) and its subsets."""

    name: str = option(flag="--dataset", group=_WHAT, required=True, registry="dpnoise.data.DATASETS",
                       choices=("cifar10-jpeg", "digits", "fashion-mnist", "mnist", "sst2"),
                       help="packaged dataset (a missing one is reported with its install command)")
    limit: Optional[int] = option(None, flag="--limit", group=_WHAT, check=("check_count", 1),
                                  help="train on a deterministic class-balanced subset of this size")
    test_limit: Optional[int] = option(None, flag="--test-limit", group=_WHAT, check=("check_count", 1),
                                       help="evaluate on a class-balanced subset of this size of the evaluation "
                                       "split")
    root: Optional[Path] = option(None, flag="--data-root", group=_WHAT, check=("existing_folder",),
                                  help="folder with the dataset files instead of the default place")
    max_length: int = option(64, flag="--max-length", group=_WHAT, check=("count_in", *MAX_LENGTH_RANGE),
                             help="text datasets: sentences are cut to this many tokens, [CLS] and [SEP] included "
                             f"({MAX_LENGTH_RANGE[0]} to {MAX_LENGTH_RANGE[1]}, default 64; MiniLM-L6's own "
                             "tokenizer); each batch is padded to its own longest sentence")
    eval_split: str = option("test", flag="--eval-split", group=_WHAT, choices=EVAL_SPLITS,
                             help="the split evaluated after every epoch: test (default), or dev (sst2: GLUE's 872 "
                             "validation sentences, where published SST-2 accuracies are measured)")
    #: None: GroupNorm, no privacy cost (the statistics: :mod:`dpnoise.mechanisms.channel_statistics`,
    #: accounted with the training steps)
    feature_statistics_noise: Optional[float] = option(
        None, flag="--feature-statistics-noise", group=_WHAT, check=("check_positive",), metavar="SIGMA",
        help="scatternet models: standardise the features per channel with their mean and variance released with "
        "Gaussian noise of multiplier SIGMA (clipping thresholds from noisy quantiles; 4 Gaussian releases, composed "
        "into every accountant and the calibration) instead of GroupNorm; Tramer & Boneh used 8 (default: GroupNorm, "
        "no privacy cost)")

    def __post_init__(self) -> None:
        _as_path(self, "root")


@dataclass(frozen=True)
class MechanismConfig:
    """The mechanism (``dpnoise.mechanisms.RUNNABLE_MECHANISMS``), its noise and clipping."""

    name: str = option(flag="--mechanism", group=_PRIVACY, required=True, registry="dpnoise.mechanisms.RUNNABLE_MECHANISMS",
                       choices=lambda: tuple(sorted(MECHANISMS)),
                       help="{mechanisms}. Output mechanisms protect the released outputs, not the parameters "
                       "(docs/theory/dirichlet.md §5)")
    #: in the mechanism's own unit (:data:`dpnoise.accounting.MECHANISMS`); None: calibrated from the privacy target
    noise: Optional[float] = option(None, flag="--noise", group=_PRIVACY, check=("check_positive",),
                                    help="fixed noise instead of calibrating; {noise_units}")
    clip: float = option(1.0, flag="--clip", group=_PRIVACY, check=("check_positive",),
                         help="clipping norm C: per-example gradient L2 norm (gaussian, lap2), L1 norm (laplace-l1), "
                         "or penultimate activation L2 norm; unused by dirichlet (default 1)")
    alpha: float = option(1.0, flag="--alpha", group=_PRIVACY, check=("check_positive",),
                          help="Dirichlet offset alpha > 0 (dirichlet only; default 1)")
    grad_sample_mode: str = option(
        "auto", flag="--grad-sample-mode", group=_PRIVACY, registry="dpnoise.training.GRAD_SAMPLE_MODES",
        choices=("auto", "bookkeeping", "hooks"),
        help="per-example gradients of gradient mechanisms: 'hooks' (Opacus, every layer materialised), "
        "'bookkeeping' (dense layers clipped without materialising; same clipped sums, faster) or 'auto' (default: "
        "bookkeeping where every layer supports it)")
    noise_shares: str = option("split", flag="--noise-shares", group=_RUN, choices=NOISE_SHARES,
                               help="under torchrun: split (default; every process adds one of K independent noise "
                               "shares) or rank0 (rank 0 adds all the noise); docs/DISTRIBUTED.md")


@dataclass(frozen=True)
class PrivacyTarget:
    """The budget: ``epsilon`` (None with a fixed ``MechanismConfig.noise``) at ``delta``."""

    delta: float = option(flag="--delta", group=_PRIVACY, check=("check_delta",),
                          help="target delta, e.g. 1e-5 (required unless a --recipe sets it)")
    epsilon: Optional[float] = option(None, flag="--epsilon", group=_PRIVACY, check=("check_positive",),
                                      help="target epsilon: calibrates the noise for --epochs (unless --noise is "
                                      "given) and stops training before the budget is exceeded")
    #: None: the mechanism's sound default
    accountant: Optional[str] = option(None, flag="--accountant", group=_PRIVACY, metavar="NAME",
                                       help="primary accountant (budget and headline epsilon); default: the sound "
                                       "default of the mechanism. All applicable ones are reported. One of: "
                                       "{accountants}")
    #: only with ``MechanismConfig.noise`` None (a given noise is not calibrated); None: the primary
    calibrate_with: Optional[str] = option(None, flag="--calibrate-with", group=_PRIVACY, metavar="NAME",
                                           help="accountant used to calibrate the noise to --epsilon (default: the "
                                           "primary; refused with --noise, where nothing is calibrated); "
                                           "'lap2-paper' is allowed for reproducing the Lap2 paper but warned: it is "
                                           "not a valid bound")


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser over the trainable parameters."""

    name: str = option("adam", flag="--optimizer", group=_OPTIMISATION, choices=tuple(DEFAULT_LR),
                       help="the optimiser (default adam)")
    #: None: ``DEFAULT_LR[name]`` (or the Dirichlet heuristic with ``effective_lr``)
    lr: Optional[float] = option(None, flag="--lr", group=_OPTIMISATION, check=("check_positive",),
                                 help="learning rate (default: "
                                 + ", ".join(f"{lr:g} for {name}" for name, lr in DEFAULT_LR.items()) + ")")
    effective_lr: Optional[float] = option(
        None, flag="--effective-lr", group=_OPTIMISATION, check=("check_positive",),
        help="dirichlet only, instead of --lr: lr = effective_lr / kappa(s_y=0.9; r, alpha), the Dirichlet-mechanism "
        "paper's heuristic for SGD (docs/theory/dirichlet.md §4). Adam already normalises the gradient scale, so with "
        "adam this mostly just raises the lr")
    #: SGD only (any other optimiser refuses a momentum other than 0)
    momentum: float = option(0.0, flag="--momentum", group=_OPTIMISATION, check=("fraction",),
                             help="SGD momentum in [0, 1) (--optimizer sgd only; default 0)")
    weight_decay: float = option(0.0, flag="--weight-decay", group=_OPTIMISATION, check=("nonnegative",),
                                 help="weight decay (default 0; the Lap2 paper used 1e-4)")
    label_smoothing: float = option(0.0, flag="--label-smoothing", group=_OPTIMISATION, check=("fraction",),
                                    help="label smoothing in [0, 1) (default 0; the Lap2 paper used 0.15)")
    lr_schedule: str = option("constant", flag="--lr-schedule", group=_OPTIMISATION, choices=LR_SCHEDULES,
                              help="constant (default) or cosine: the lr decays to 0 over the planned steps")
    #: post-processing, no privacy cost.  None: no average
    ema_decay: Optional[float] = option(None, flag="--ema-decay", group=_OPTIMISATION, check=("open_fraction",),
                                        help="evaluate an exponential moving average of the parameters with this "
                                        "decay in (0, 1), warmed up as min(decay, (1+t)/(10+t)); free post-processing "
                                        "of the private iterates (default: none)")


@dataclass(frozen=True)
class Schedule:
    """How long: ceil(epochs / q) Poisson-sampled steps at q = batch_size / N."""

    epochs: float = option(flag="--epochs", group=_OPTIMISATION, check=("check_positive",),
                           help="epochs E; the run takes ceil(E / q) Poisson-sampled steps, q = batch/N (required "
                           "unless a --recipe sets it)")
    batch_size: int = option(flag="--batch-size", group=_OPTIMISATION, check=("check_count", 1),
                             help="expected (Poisson) batch size B (required unless a --recipe sets it)")
    max_steps: Optional[int] = option(None, flag="--max-steps", group=_OPTIMISATION, check=("check_count", 1),
                                      help="stop after this many steps in total (the noise is still calibrated for "
                                      "--epochs)")
    #: None: one physical batch
    physical_batch_size: Optional[int] = option(
        None, flag="--physical-batch-size", group=_OPTIMISATION, check=("check_count", 1),
        help="process each Poisson batch in pieces of at most this many examples: their clipped gradients are summed "
        "and noised once, the same step in less memory (default: one piece)")


@dataclass(frozen=True)
class OutputConfig:
    """Where the run's files go and where it resumes from."""

    folder: Optional[Path] = option(None, flag="--out", group=_RUN, check=("output_folder",),
                                    help="write metrics.json, steps.csv, epochs.csv, curves.png and checkpoint.pt "
                                    "here (the checkpoint after every epoch)")
    resume: Optional[Path] = option(None, flag="--resume", group=_RUN, check=("checkpoint_file",),
                                    help="continue from a checkpoint written by --out")
    #: a progress bar on stderr
    progress: bool = option(True, flag="--no-progress", group=_RUN, help="no progress bar")

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
    model: str = option(
        "cnn", flag="--model", group=_WHAT, registry="dpnoise.models.MODELS",
        choices=("cnn", "resnet-gn", "resnet-gn-small", "minilm", "minilm-features", "efficientnet-lite0",
                 "efficientnet-lite0-features", "scatternet-linear", "scatternet-cnn"),
        help="cnn: the TensorFlow Privacy tutorial's 4-layer CNN (default); resnet-gn: GroupNorm ResNet (0.31M "
        "parameters; resnet-gn-small: half width, 78k); minilm: MiniLM-L6 for sst2, Hugging Face's "
        "BertForSequenceClassification fine-tuned on the tokenizer's ids and attention masks (which parameters: "
        "--trainable); minilm-features: frozen MiniLM-L6 sentence embeddings (mean pooled, computed once and cached), "
        "only a linear head is trained (sst2); efficientnet-lite0: ImageNet EfficientNet-Lite0 with a new linear head, "
        "every parameter fine-tuned (3.38M with 10 classes), BatchNorm frozen at its ImageNet statistics (a per-channel "
        "affine map whose scale and shift train), RGB datasets; efficientnet-lite0-features: frozen ImageNet backbone, "
        "features cached, only the linear head is trained (RGB datasets); scatternet-linear / scatternet-cnn: frozen ScatterNet "
        "features (kymatio, J=2, L=8, computed once and cached) under GroupNorm and a linear or small CNN head "
        "(Tramer & Boneh 2021; needs the train extra)")
    #: None: last-block
    trainable: Optional[str] = option(
        None, flag="--trainable", group=_WHAT, registry="dpnoise.models.TRAINABLE_PARTS",
        choices=("last-block", "all", "no-embeddings", "lora", "head"),
        help="minilm only, which parameters are fine-tuned: last-block (default: the last encoder block, the pooler "
        "and the head, 1.9M parameters), all (full fine-tuning, 22.7M), no-embeddings (all but the token, position "
        "and token-type embeddings, 10.8M), lora (LoRA adapters of rank --lora-rank on the attention's query and "
        "value projections, and the head: 74,498 at rank 8; needs peft), head (the pooler and the head, 148,610). "
        "Lap2's accountant is given the number trained")
    #: None: 8
    lora_rank: Optional[int] = option(None, flag="--lora-rank", group=_WHAT, check=("check_count", 1), metavar="R",
                                      help="--trainable lora only: the rank of the adapters (default 8; scaling "
                                      "alpha / R = 2)")
    #: None: DEFAULT_RESOLUTION of dpnoise.models.efficientnet_lite
    resolution: Optional[int] = option(None, flag="--resolution", group=_WHAT, check=("count_in", *RESOLUTION_RANGE),
                                       metavar="PIXELS",
                                       help="efficientnet models only: images are resized to this side (bilinear) "
                                       f"before the backbone ({RESOLUTION_RANGE[0]} to {RESOLUTION_RANGE[1]}; default "
                                       "128; EfficientNet-Lite0 was trained at 224; the compute grows with its square)")
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    #: the public seed (not the private randomness)
    seed: int = option(0, flag="--seed", group=_RUN, check=("seed",),
                       help="public seed for model initialisation and data-loader workers (default 0); the noise and "
                       "the Poisson sampling are secret, seeded from the operating system's entropy")
    #: the private randomness (the noise, the Poisson sampling, noisy statistics): None (default) secret, from the
    #: operating system's entropy (:mod:`dpnoise.training.randomness`)
    noise_seed: Optional[int] = option(None, flag="--noise-seed", group=_RUN, check=("seed",),
                                       help="seed the noise and the Poisson sampling too, for a reproducible run: "
                                       "anyone who knows it can regenerate the noise and remove it (warned); "
                                       "default: secret")
    #: gradient mechanisms of SECURE_MODE_MECHANISMS only, one process, without noise_seed
    secure_mode: bool = option(
        False, flag="--secure-mode", group=_RUN,
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
    threads: Optional[int] = option(None, flag="--threads", group=_RUN, check=("check_count", 1),
                                    help="torch CPU threads (default: torch's choice; per process under torchrun)")
    #: under ``torchrun``, "cuda" is each rank's ``cuda:LOCAL_RANK``
    device: str = option("auto", flag="--device", group=_RUN, choices=DEVICE_CHOICES,
                         help="where the model, batches, clipping, noise and sampler live: auto (default): cuda when "
                         "available, else cpu")

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


def _without_none(hint: Any) -> Any:
    """``Optional[X]`` -> ``X``; any other type unchanged."""
    if get_origin(hint) is Union:
        (kind,) = [arg for arg in get_args(hint) if arg is not type(None)]
        return kind
    return hint


def _declared_options(kind: type, prefix: str = "") -> dict[str, Option]:
    """Every field's :class:`Option` of ``kind`` (sections included), in declaration order, completed with
    the field's dotted path, type and default."""
    hints = get_type_hints(kind)
    found: dict[str, Option] = {}
    for f in fields(kind):
        if kind is TrainingConfig and f.name in SECTIONS:
            found.update(_declared_options(SECTIONS[f.name], f"{f.name}."))
        elif "option" in f.metadata:
            path = prefix + f.name
            found[path] = replace(f.metadata["option"], path=path, type=_without_none(hints[f.name]),
                                  default=f.default)
    return found


#: dotted field path -> its :class:`Option`, in declaration order (the order of the checks)
OPTIONS: dict[str, Option] = _declared_options(TrainingConfig)


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


def field_value(config: TrainingConfig, path: str) -> Any:
    """The value of the field at the dotted ``path`` of ``config``."""
    value: Any = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def check_declared(config: TrainingConfig) -> None:
    """Each field against its :class:`Option`, in :data:`OPTIONS` order: its ``check``, and its ``choices``
    unless a registry holds them.  None passes where it is the default (not given)."""
    for path, declared in OPTIONS.items():
        value = field_value(config, path)
        if value is None and declared.default is None:
            continue
        if declared.check:
            check_field(path, declared.check[0], value, *declared.check[1:])
        if declared.choices is not None and declared.registry is None and value not in declared.allowed():
            raise InvalidConfigError(lambda n, path=path, value=value, choices=declared.allowed():
                                     f"{n(path)} must be one of {', '.join(choices)}, got {value!r}")


def check_config(config: TrainingConfig) -> None:
    """Check every field that needs no registry (finite, in range, paths usable) before any work.

    The per-field checks are those the fields declare (:func:`check_declared`); the checks across fields
    follow.  The checks that need the dataset sizes or the mechanism's accountants are in
    :func:`dpnoise.training.preparation.check_against_registries`.
    """
    if not isinstance(config, TrainingConfig):
        raise InvalidConfigError(lambda n: f"the configuration must be a TrainingConfig, got {type(config).__name__}")
    for section, kind in SECTIONS.items():
        value = getattr(config, section)
        if not isinstance(value, kind):
            raise InvalidConfigError(lambda n, section=section, kind=kind, value=value:
                                     f"{n(section)} must be a {kind.__name__}, got {value!r}")
    mech, privacy, opt = config.mechanism, config.privacy, config.optimizer
    if privacy.epsilon is None and mech.noise is None:
        raise InvalidConfigError(lambda n: f"give {n('privacy.epsilon')} (calibrate the noise) or "
                                           f"{n('mechanism.noise')} (fixed noise), or both")
    if opt.effective_lr is not None and (not effective_lr_applies(mech.name) or opt.lr is not None):
        raise InvalidConfigError(lambda n: f"{n('optimizer.effective_lr')} applies to {n('mechanism.name')} "
                                           f"{' or '.join(effective_lr_mechanisms())} without {n('optimizer.lr')}")
    check_declared(config)
    if opt.momentum != 0 and opt.name != "sgd":  # refused rather than silently ignored
        raise InvalidConfigError(lambda n: f"{n('optimizer.momentum')} applies to {n('optimizer.name')} sgd only, "
                                           f"got {opt.momentum!r} with {opt.name!r}")
    if config.lora_rank is not None and config.trainable != "lora":
        raise InvalidConfigError(lambda n: f"{n('lora_rank')} applies to {n('trainable')} lora only")
    check_secure_mode(config)
    if privacy.calibrate_with is not None and mech.noise is not None:
        raise InvalidConfigError(lambda n: f"{n('privacy.calibrate_with')} applies only when the noise is "
                                           f"calibrated: give {n('privacy.epsilon')} without {n('mechanism.noise')}")


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
