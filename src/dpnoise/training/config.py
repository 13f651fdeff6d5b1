"""The configuration of a private training run (:func:`dpnoise.training.train_private`).

A :class:`TrainingConfig` groups what ``dpnoise train`` takes as flags: the data, the model, the
privacy options (the mechanism, its noise and clipping, the target, the planned epochs), the schedule,
the execution options (device, physical batches, ...), the optimiser, the output folder, the seed and
the threads.  Its ``privacy`` and ``execution`` sections are the options ``make_private`` takes
themselves (:class:`~dpnoise.training.privacy_plan.PrivacyOptions`,
:class:`~dpnoise.training.execution.ExecutionOptions`), which are checked when built.  Each field is
declared once: its :func:`~dpnoise.training.options.option` metadata holds its command-line flag,
help, check and choices, from which the command line builds its parser (:data:`OPTIONS`) and
:func:`check_fields` its checks.  :meth:`TrainingConfig.from_fields` and :func:`check_config` run
them before anything is built or done and raise :class:`InvalidConfigError`, whose message names the
field by its dotted path (``privacy.target_epsilon must be finite and > 0, got nan``); a front end that
calls the fields otherwise (the command line: its flags) renders the same message with its own
names through :meth:`InvalidConfigError.named`.

This module imports no torch (nor does the package :mod:`dpnoise.training` until one of its
torch-side names is used).
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Union, get_args, get_origin, get_type_hints

from dpnoise import checks
from dpnoise.accounting import MECHANISMS
from dpnoise.accounting.mechanisms import option_fields
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.training.execution import ExecutionOptions
from dpnoise.training.options import OPTIMISATION, RUN, WHAT, Option, Rule, broken_rule, option
from dpnoise.training.privacy_plan import PRIVACY_RULES, SECURE_MODE_MECHANISMS, PrivacyOptions, mechanism_options

#: learning rate of each optimiser when none is given
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}
#: models that take token ids (text datasets); every other model takes images
TEXT_MODELS = ("minilm", "minilm-features")
#: MiniLM-L6 has 512 positions; [CLS] and [SEP] take two
MAX_LENGTH_RANGE = (2, 512)
#: the tokens a sentence of a text dataset is cut to when ``data.max_length`` is not given
DEFAULT_MAX_LENGTH = 64
#: the image sides the EfficientNet models accept (``resolution``)
RESOLUTION_RANGE = (32, 512)
#: file name of the checkpoint written into the output folder after every epoch
CHECKPOINT_NAME = "checkpoint.pt"
#: learning-rate schedules over the planned steps: constant, or cosine decay to 0 (Loshchilov & Hutter, arXiv 1608.03983)
LR_SCHEDULES = ("constant", "cosine")
#: the splits a run can be evaluated on ("dev" where the dataset has one: sst2)
EVAL_SPLITS = ("test", "dev")


def effective_lr_mechanisms() -> list[str]:
    """The mechanisms whose learning rate may be given as an effective one (``MechanismSpec.effective_lr``)."""
    return [name for name, spec in MECHANISMS.items() if spec.effective_lr]


def effective_lr_applies(mechanism: str) -> bool:
    return mechanism in MECHANISMS and MECHANISMS[mechanism].effective_lr


#: renders a field's dotted path (``privacy.target_epsilon``) as a front end names it
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

    name: str = option(flag="--dataset", group=WHAT, required=True, registry="dpnoise.data.DATASETS",
                       choices=checks.DatasetChoices(("cifar10-jpeg", "digits", "fashion-mnist", "mnist", "sst2")),
                       metavar="DATASET",
                       help="a packaged dataset, cifar10-jpeg, digits, fashion-mnist, mnist or sst2 (a missing one is "
                       "reported with its install command), or your own: csv:PATH, json:PATH, parquet:PATH (a text "
                       "column, --text-column, and a label column, --label-column; labels of any type, any number of "
                       "classes), imagefolder:PATH (one folder of images per class) or disk:PATH (a Hugging Face "
                       "datasets folder saved with save_to_disk); needs the datasets package (the data extra). Its "
                       "evaluation split is its own test or validation split, else a held-out --eval-fraction of each "
                       "class")
    limit: Optional[int] = option(None, flag="--limit", group=WHAT, check=("check_count", 1),
                                  help="train on a deterministic class-balanced subset of this size")
    test_limit: Optional[int] = option(None, flag="--test-limit", group=WHAT, check=("check_count", 1),
                                       help="evaluate on a class-balanced subset of this size of the evaluation "
                                       "split")
    root: Optional[Path] = option(None, flag="--data-root", group=WHAT, check=("existing_folder",),
                                  help="folder with the dataset files instead of the default place")
    #: text datasets only (refused for the others); None: DEFAULT_MAX_LENGTH
    max_length: Optional[int] = option(None, flag="--max-length", group=WHAT, check=("count_in", *MAX_LENGTH_RANGE),
                                       help="text datasets only: sentences are cut to this many tokens, [CLS] and "
                                       f"[SEP] included ({MAX_LENGTH_RANGE[0]} to {MAX_LENGTH_RANGE[1]}, default "
                                       f"{DEFAULT_MAX_LENGTH}; MiniLM-L6's own tokenizer); each batch is padded to "
                                       "its own longest sentence")
    eval_split: str = option("test", flag="--eval-split", group=WHAT, choices=EVAL_SPLITS,
                             help="the split evaluated after every epoch: test (default), or dev (sst2: GLUE's 872 "
                             "validation sentences, where published SST-2 accuracies are measured)")
    #: None: GroupNorm, no privacy cost (the statistics: :mod:`dpnoise.mechanisms.channel_statistics`,
    #: accounted with the training steps)
    feature_statistics_noise: Optional[float] = option(
        None, flag="--feature-statistics-noise", group=WHAT, check=("check_positive",), metavar="SIGMA",
        help="scatternet models: standardise the features per channel with their mean and variance released with "
        "Gaussian noise of multiplier SIGMA (clipping thresholds from noisy quantiles; 4 Gaussian releases, composed "
        "into every accountant and the calibration) instead of GroupNorm; Tramer & Boneh used 8 (default: GroupNorm, "
        "no privacy cost)")

    #: a user's data set (``name`` a ``kind:PATH`` source) only; None: the defaults of dpnoise.data.files
    text_column: Optional[str] = option(None, flag="--text-column", group=WHAT, metavar="COLUMN",
                                        help="csv/json/parquet/disk data: the column of texts (default: the first of "
                                        "text, sentence, content, review)")
    text_pair_column: Optional[str] = option(None, flag="--text-pair-column", group=WHAT, metavar="COLUMN",
                                             help="csv/json/parquet/disk data: a column of second texts, tokenized "
                                             "with the first as a pair")
    label_column: Optional[str] = option(None, flag="--label-column", group=WHAT, metavar="COLUMN",
                                         help="your own data: the column of labels (default label); the label names "
                                         "are saved in the output folder's labels.json")
    eval_fraction: Optional[float] = option(None, flag="--eval-fraction", group=WHAT, check=("fraction",),
                                            help="your own data without an evaluation split: the fraction of the "
                                            "rows held out for evaluation, each row by a hash of its own content, so "
                                            "that adding or removing a row moves no other row (default 0.1)")
    unit_column: Optional[str] = option(None, flag="--privacy-unit", group=WHAT, metavar="COLUMN",
                                        help="your own data: the column naming each example's privacy unit (a user "
                                        "or document id): the epsilon then protects a unit with all its examples; "
                                        "units are Poisson-sampled whole (--batch-size is the expected number of "
                                        "units per batch) and each unit's gradient is clipped as one (gradient "
                                        "mechanisms, flat or automatic clipping, one process, no "
                                        "--physical-batch-size)")

    def __post_init__(self) -> None:
        _as_path(self, "root")


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimiser over the trainable parameters."""

    name: str = option("adam", flag="--optimizer", group=OPTIMISATION, choices=tuple(DEFAULT_LR),
                       help="the optimiser (default adam)")
    #: None: ``DEFAULT_LR[name]`` (or the Dirichlet heuristic with ``effective_lr``)
    lr: Optional[float] = option(None, flag="--lr", group=OPTIMISATION, check=("check_positive",),
                                 help="learning rate (default: "
                                 + ", ".join(f"{lr:g} for {name}" for name, lr in DEFAULT_LR.items()) + ")")
    effective_lr: Optional[float] = option(
        None, flag="--effective-lr", group=OPTIMISATION, check=("check_positive",),
        help="dirichlet only, instead of --lr: lr = effective_lr / kappa(s_y=0.9; r, alpha), the Dirichlet-mechanism "
        "paper's heuristic for SGD (docs/theory/dirichlet.md §4). Adam already normalises the gradient scale, so with "
        "adam this mostly just raises the lr")
    #: SGD only (any other optimiser refuses a momentum other than 0)
    momentum: float = option(0.0, flag="--momentum", group=OPTIMISATION, check=("fraction",),
                             help="SGD momentum in [0, 1) (--optimizer sgd only; default 0)")
    weight_decay: float = option(0.0, flag="--weight-decay", group=OPTIMISATION, check=("nonnegative",),
                                 help="weight decay (default 0; the Lap2 paper used 1e-4)")
    label_smoothing: float = option(0.0, flag="--label-smoothing", group=OPTIMISATION, check=("fraction",),
                                    help="label smoothing in [0, 1) (default 0; the Lap2 paper used 0.15)")
    lr_schedule: str = option("constant", flag="--lr-schedule", group=OPTIMISATION, choices=LR_SCHEDULES,
                              help="constant (default) or cosine: the lr decays to 0 over the planned steps")
    #: post-processing, no privacy cost.  None: no average
    ema_decay: Optional[float] = option(None, flag="--ema-decay", group=OPTIMISATION, check=("open_fraction",),
                                        help="evaluate an exponential moving average of the parameters with this "
                                        "decay in (0, 1), warmed up as min(decay, (1+t)/(10+t)); free post-processing "
                                        "of the private iterates (default: none)")


@dataclass(frozen=True)
class Schedule:
    """How many examples a step takes, and when the run stops (its planned length is ``privacy.epochs``:
    ceil(epochs / q) Poisson-sampled steps at q = batch_size / N)."""

    batch_size: int = option(flag="--batch-size", group=OPTIMISATION, check=("check_count", 1),
                             help="expected (Poisson) batch size B (required unless a --recipe sets it)")
    max_steps: Optional[int] = option(None, flag="--max-steps", group=OPTIMISATION, check=("check_count", 1),
                                      help="stop after this many steps in total (the noise is still calibrated for "
                                      "--epochs)")


@dataclass(frozen=True)
class OutputConfig:
    """Where the run's files go and where it resumes from."""

    folder: Optional[Path] = option(None, flag="--out", group=RUN, check=("output_folder",),
                                    help="write metrics.json, steps.csv, epochs.csv, curves.png and checkpoint.pt "
                                    "here (the checkpoint after every epoch): the settings, each step's epsilon and "
                                    "the evaluations, nothing computed from a private batch unless "
                                    "--log-private-batch-stats")
    resume: Optional[Path] = option(None, flag="--resume", group=RUN, check=("checkpoint_file",),
                                    help="continue from a checkpoint written by --out")
    #: resume a checkpoint older than its run's latest (its run record), counting the steps taken after it
    resume_older: bool = option(False, flag="--resume-older", group=RUN,
                                help="with --resume: accept a checkpoint older than its run's latest one (refused "
                                "otherwise, since its accountants lack the later steps); the resumed run counts every "
                                "step the run took and continues from the latest step count")
    #: a progress bar on stderr
    progress: bool = option(True, flag="--no-progress", group=RUN, help="no progress bar")
    #: each step's loss, accuracy and size of its private batch in the outputs and the progress bar: computed
    #: without noise, not covered by the epsilon (warned)
    log_private_batch_stats: bool = option(
        False, flag="--log-private-batch-stats", group=RUN,
        help="also record each step's training loss, training-batch accuracy and batch size (in steps.csv, "
        "metrics.json, curves.png and the checkpoint) and show their running means on the progress bar. They are "
        "computed from the private training batches without noise and are NOT covered by the epsilon (warned); "
        "default: the outputs hold only the steps, the epsilon, the sample rate and the evaluations")

    def __post_init__(self) -> None:
        _as_path(self, "folder")
        _as_path(self, "resume")


@dataclass(frozen=True)
class TrainingConfig:
    """Everything a private training run needs (:func:`dpnoise.training.train_private`)."""

    data: DataConfig
    #: the mechanism, its noise and clipping, the target and the planned epochs (a training run sets the
    #: data releases and stops at the budget: ``on_budget_exhausted="stop"``)
    privacy: PrivacyOptions
    schedule: Schedule
    execution: ExecutionOptions = field(default_factory=ExecutionOptions)
    model: str = option(
        "cnn", flag="--model", group=WHAT, registry="dpnoise.models.MODELS",
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
        None, flag="--trainable", group=WHAT, registry="dpnoise.models.TRAINABLE_PARTS",
        choices=("last-block", "all", "no-embeddings", "lora", "head"),
        help="minilm only, which parameters are fine-tuned: last-block (default: the last encoder block, the pooler "
        "and the head, 1.9M parameters), all (full fine-tuning, 22.7M), no-embeddings (all but the token, position "
        "and token-type embeddings, 10.8M), lora (LoRA adapters of rank --lora-rank on the attention's query and "
        "value projections, and the head: 74,498 at rank 8; needs peft), head (the pooler and the head, 148,610). "
        "Lap2's accountant is given the number trained")
    #: None: 8
    lora_rank: Optional[int] = option(None, flag="--lora-rank", group=WHAT, check=("check_count", 1), metavar="R",
                                      help="--trainable lora only: the rank of the adapters (default 8; scaling "
                                      "alpha / R = 2)")
    #: None: DEFAULT_RESOLUTION of dpnoise.models.efficientnet_lite
    resolution: Optional[int] = option(None, flag="--resolution", group=WHAT, check=("count_in", *RESOLUTION_RANGE),
                                       metavar="PIXELS",
                                       help="efficientnet models only: images are resized to this side (bilinear) "
                                       f"before the backbone ({RESOLUTION_RANGE[0]} to {RESOLUTION_RANGE[1]}; default "
                                       "128; EfficientNet-Lite0 was trained at 224; the compute grows with its square)")
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    #: the public seed (not the private randomness)
    seed: int = option(0, flag="--seed", group=RUN, check=("seed",),
                       help="public seed for model initialisation and data-loader workers (default 0); the noise and "
                       "the Poisson sampling are secret, seeded from the operating system's entropy")
    #: the private randomness (the noise, the Poisson sampling, noisy statistics): None (default) secret, from the
    #: operating system's entropy (:mod:`dpnoise.training.randomness`)
    noise_seed: Optional[int] = option(None, flag="--noise-seed", group=RUN, check=("seed",),
                                       help="seed the noise and the Poisson sampling too, for a reproducible run: "
                                       "anyone who knows it can regenerate the noise and remove it (warned); "
                                       "default: secret")
    threads: Optional[int] = option(None, flag="--threads", group=RUN, check=("check_count", 1),
                                    help="torch CPU threads (default: torch's choice; per process under torchrun)")

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> "TrainingConfig":
        """A configuration from ``{dotted path: value}`` (``{"data.name": "digits", "seed": 0, ...}``);
        paths that are left out keep their defaults; a mechanism option is ``privacy.options`` (a mapping) or
        its own path (``privacy.options.alpha``).  The fields are checked (:func:`check_fields`) before the
        sections are built, so that an error names the field by its path."""
        if not isinstance(values, Mapping):
            raise InvalidParameterError(f"TrainingConfig.from_fields takes a mapping of dotted field paths to values, "
                                        f"got a {type(values).__name__}")
        values = _with_nested_options(values)
        groups: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        top: dict[str, Any] = {}
        for path, value in values.items():
            if not isinstance(path, str):
                raise InvalidParameterError(f"configuration field paths are strings, got {path!r}")
            group, _, name = path.rpartition(".")
            known = {f.name for f in fields(SECTIONS[group] if group in SECTIONS else cls) if f.init}
            if group not in ("", *SECTIONS) or name not in known or (not group and name in SECTIONS):
                raise InvalidParameterError(f"unknown configuration field {path!r}")
            (groups[group] if group else top)[name] = value
        check_fields(lambda path: values.get(path, {} if path == MECHANISM_OPTIONS else OPTIONS[path].default))
        return cls(**{name: SECTIONS[name](**group) for name, group in groups.items() if group}, **top)


def _with_nested_options(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``values`` with every ``privacy.options.<name>`` path moved into the ``privacy.options`` mapping."""
    prefix = MECHANISM_OPTIONS + "."
    dotted = {path[len(prefix):]: value for path, value in values.items() if isinstance(path, str)
              and path.startswith(prefix)}
    if not dotted:
        return values
    plain = {path: value for path, value in values.items() if not (isinstance(path, str) and path.startswith(prefix))}
    return {**plain, MECHANISM_OPTIONS: {**dict(plain.get(MECHANISM_OPTIONS) or {}), **dotted}}


#: the groups of a :class:`TrainingConfig` (field name -> its dataclass)
SECTIONS: dict[str, type] = {"data": DataConfig, "privacy": PrivacyOptions, "schedule": Schedule,
                             "execution": ExecutionOptions, "optimizer": OptimizerConfig, "output": OutputConfig}


def _option_type(hint: Any) -> Any:
    """The type a flag's value is parsed as: ``Optional[X]`` -> ``X``, a ``Literal`` of strings -> ``str``."""
    if get_origin(hint) is Union:
        (hint,) = [arg for arg in get_args(hint) if arg is not type(None)]
    if get_origin(hint) is Literal:
        (hint,) = {type(arg) for arg in get_args(hint)}
    return hint


def _declared_options(kind: type, prefix: str = "") -> dict[str, Option]:
    """Every field's :class:`Option` of ``kind`` (sections included), in declaration order, completed with
    the field's dotted path, type (unless declared) and default in a configuration (``MISSING`` where the
    option is ``needed``)."""
    hints = get_type_hints(kind)
    found: dict[str, Option] = {}
    for f in fields(kind):
        if kind is TrainingConfig and f.name in SECTIONS:
            found.update(_declared_options(SECTIONS[f.name], f"{f.name}."))
        elif "option" in f.metadata:
            declared: Option = f.metadata["option"]
            path = prefix + f.name
            found[path] = replace(declared, path=path, type=declared.type or _option_type(hints[f.name]),
                                  default=MISSING if declared.needed else f.default)
    return found


#: dotted field path -> its :class:`Option`, in declaration order (the order of the checks)
OPTIONS: dict[str, Option] = _declared_options(TrainingConfig)


#: the configuration field of the mechanism's side parameters (:attr:`PrivacyOptions.options`, a mapping of its
#: fields in a configuration); the command line generates one flag per option field of every registered mechanism
MECHANISM_OPTIONS = "privacy.options"


def option_flag_of(path: str) -> str:
    """The ``dpnoise train`` flag of a configuration field by its dotted path (a mechanism option's
    ``privacy.options.<field>`` too)."""
    prefix = MECHANISM_OPTIONS + "."
    if path.startswith(prefix) and path[len(prefix):] in option_fields():
        return option_fields()[path[len(prefix):]].flag
    return OPTIONS[path].flag


def non_default_fields(config: TrainingConfig) -> dict[str, Any]:
    """``{dotted path: value}`` of every field of ``config`` that differs from its default in a configuration,
    and of every field without one, with the mechanism's options that differ from theirs
    (:data:`MECHANISM_OPTIONS`): what gives ``config`` back through :meth:`TrainingConfig.from_fields`."""
    values = {path: field_value(config, path) for path in OPTIONS}
    found = {path: value for path, value in values.items()
             if OPTIONS[path].default is MISSING or value != OPTIONS[path].default}
    options = config.privacy.options
    defaults = type(options)().to_dict()
    changed = {name: value for name, value in options.to_dict().items() if value != defaults[name]}
    return {**found, MECHANISM_OPTIONS: changed} if changed else found


def to_argv(config: TrainingConfig) -> list[str]:
    """The ``dpnoise train`` arguments (after ``train``) that build ``config``: the flag of each field of
    :func:`non_default_fields` with its value (a switch alone for a bool; floats written exactly, by
    ``repr``), the mechanism's options by their generated flags.  The privacy options without a flag
    (``data_releases``, ``on_budget_exhausted``: a training run sets them) are refused when they are not their
    defaults.  Tested by a round trip: the command line's configuration is ``config``."""
    privacy = config.privacy
    if privacy.data_releases or privacy.on_budget_exhausted != "raise":
        raise InvalidParameterError("privacy.data_releases and privacy.on_budget_exhausted have no dpnoise train "
                                    "flag (a training run sets them)")
    argv: list[str] = []
    for path, value in non_default_fields(config).items():
        if path == MECHANISM_OPTIONS:
            for name, option_value in value.items():
                argv += [option_flag_of(f"{path}.{name}"), _argument(option_value)]
            continue
        declared = OPTIONS[path]
        argv += [declared.flag] if declared.type is bool else [declared.flag, _argument(value)]
    return argv


def _argument(value: Any) -> str:
    """A field's value as the command line parses it back (``repr`` of a float round-trips exactly)."""
    return repr(value) if isinstance(value, float) else str(value)


def check_field(path: str, check: str, value: Any, *extra: Any) -> Any:
    """``dpnoise.checks.<check>(path, value, *extra)``; its error becomes an :class:`InvalidConfigError`
    (whose :meth:`~InvalidConfigError.named` runs the check again under the other name)."""
    return checked_by_name(lambda naming: getattr(checks, check)(naming(path), value, *extra))


def checked_by_name(check: Callable[[Naming], Any]) -> Any:
    """``check(str)``: a check that calls the fields it checks ``naming(path)``; its error becomes an
    :class:`InvalidConfigError` whose :meth:`~InvalidConfigError.named` runs it again under the other names."""
    try:
        return check(str)
    except InvalidParameterError:
        def describe(naming: Naming) -> str:
            try:
                check(naming)
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


#: the value of a field, by dotted path (``MISSING``: not given and without a default)
FieldValue = Callable[[str], Any]


def check_declared(value_at: FieldValue) -> None:
    """Each field against its :class:`Option`, in :data:`OPTIONS` order: its ``check``, and its ``choices``
    unless a registry holds them.  None passes where it is the default (not given)."""
    for path, declared in OPTIONS.items():
        value = value_at(path)
        if value is None and declared.default is None:
            continue
        if declared.check:
            check_field(path, declared.check[0], value, *declared.check[1:])
        if declared.choices is not None and declared.registry is None and value not in declared.allowed():
            raise InvalidConfigError(lambda n, path=path, value=value, choices=declared.allowed():
                                     f"{n(path)} must be one of {', '.join(choices)}, got {value!r}")


def check_config(config: TrainingConfig) -> None:
    """Check every field that needs no torch-side registry (finite, in range, paths usable) before any work:
    the sections' types, then :func:`check_fields`.  The checks that need the dataset sizes are in
    :func:`dpnoise.training.preparation.check_against_registries`.
    """
    if not isinstance(config, TrainingConfig):
        raise InvalidConfigError(lambda n: f"the configuration must be a TrainingConfig, got {type(config).__name__}")
    for section, kind in SECTIONS.items():
        value = getattr(config, section)
        if not isinstance(value, kind):
            raise InvalidConfigError(lambda n, section=section, kind=kind, value=value:
                                     f"{n(section)} must be a {kind.__name__}, got {value!r}")
    check_fields(lambda path: field_value(config, path))


#: the checks across a configuration's fields (the mechanism already known): the privacy options' own
#: (:data:`~dpnoise.training.privacy_plan.PRIVACY_RULES`, on the ``privacy`` fields), then which fields apply to
#: which others (each refused rather than silently ignored)
RULES: tuple[Rule, ...] = (
    *(rule.within("privacy") for rule in PRIVACY_RULES),
    Rule(lambda v: v("optimizer.effective_lr") is not None
         and (not effective_lr_applies(v("privacy.mechanism")) or v("optimizer.lr") is not None),
         lambda n, v: f"{n('optimizer.effective_lr')} applies to {n('privacy.mechanism')} "
                      f"{' or '.join(effective_lr_mechanisms())} without {n('optimizer.lr')}"),
    Rule(lambda v: v("optimizer.momentum") != 0 and v("optimizer.name") != "sgd",
         lambda n, v: f"{n('optimizer.momentum')} applies to {n('optimizer.name')} sgd only, got "
                      f"{v('optimizer.momentum')!r} with {v('optimizer.name')!r}"),
    Rule(lambda v: v("lora_rank") is not None and v("trainable") != "lora",
         lambda n, v: f"{n('lora_rank')} applies to {n('trainable')} lora only"),
    *(Rule(lambda v, path=path: v(path) is not None and checks.parse_source(v("data.name")) is None,
           lambda n, v, path=path: f"{n(path)} applies to your own data ({n('data.name')} kind:PATH), not to "
                                   f"{v('data.name')}")
      for path in ("data.text_column", "data.text_pair_column", "data.label_column", "data.eval_fraction",
                   "data.unit_column")),
    Rule(lambda v: v("data.limit") is not None and checks.parse_source(v("data.name")) is not None,
         lambda n, v: f"{n('data.limit')} with your own data: its class-balanced subset depends on the other rows (one "
                      f"row added to the file can move many in or out), so the epsilon would not hold per row of the "
                      f"file; select the rows in the file instead"),
    Rule(lambda v: bool(v("output.resume_older")) and v("output.resume") is None,
         lambda n, v: f"{n('output.resume_older')} applies with {n('output.resume')} only"),
)


def check_fields(value_at: FieldValue) -> None:
    """Check the fields of a configuration, each given by its dotted path (``value_at``), naming them.

    The per-field checks the fields declare (:func:`check_declared`) come first, then the checks across fields
    (:data:`RULES`, among them the privacy options' own, so that :meth:`TrainingConfig.from_fields` refuses by
    field what the section would refuse by option).
    """
    missing = [path for path in OPTIONS if value_at(path) is MISSING]
    if missing:
        raise InvalidConfigError(lambda n: f"give {', '.join(n(path) for path in missing)}")
    mechanism, noise = value_at("privacy.mechanism"), value_at("privacy.noise")
    if mechanism not in MECHANISMS:
        raise InvalidConfigError(lambda n: f"{n('privacy.mechanism')} must be one of {', '.join(sorted(MECHANISMS))}, "
                                           f"got {mechanism!r}")
    check_declared(value_at)
    broken = broken_rule(RULES, value_at)
    if broken is not None:
        raise InvalidConfigError(lambda n: broken.message(n, value_at))
    options = value_at(MECHANISM_OPTIONS)
    checked_by_name(lambda n: mechanism_options(MECHANISMS[mechanism], options,
                                                naming=lambda name: n(f"{MECHANISM_OPTIONS}.{name}")))
    if noise is not None:  # what the accountants compute with: the noise, or its ratio to the clip (Laplace)
        checked_by_name(lambda n: MECHANISMS[mechanism].check_noise(
            noise, value_at("privacy.max_grad_norm"), noise_name=n("privacy.noise"),
            clip_name=n("privacy.max_grad_norm")))
    check_secure_mode(value_at)


def check_secure_mode(value_at: FieldValue) -> None:
    """``privacy.secure_mode`` is True or False, and with True: a mechanism of SECURE_MODE_MECHANISMS, no
    ``noise_seed`` (secure noise cannot be reproducible) and no feature statistics (released with
    floating-point noise, which secure mode does not cover)."""
    secure = value_at("privacy.secure_mode")
    if not isinstance(secure, bool):
        raise InvalidConfigError(lambda n: f"{n('privacy.secure_mode')} must be True or False, got {secure!r}")
    if not secure:
        return
    mechanism = value_at("privacy.mechanism")
    if mechanism not in SECURE_MODE_MECHANISMS:
        raise InvalidConfigError(lambda n: f"{n('privacy.secure_mode')} serves {n('privacy.mechanism')} "
                                           f"{', '.join(SECURE_MODE_MECHANISMS)}, got {mechanism!r}")
    if value_at("noise_seed") is not None:
        raise InvalidConfigError(lambda n: f"{n('privacy.secure_mode')} draws noise nobody can reproduce; it cannot "
                                           f"be combined with {n('noise_seed')}")
    if value_at("data.feature_statistics_noise") is not None:
        raise InvalidConfigError(lambda n: f"{n('privacy.secure_mode')} does not cover "
                                           f"{n('data.feature_statistics_noise')} (its statistics are released with "
                                           "floating-point noise)")
