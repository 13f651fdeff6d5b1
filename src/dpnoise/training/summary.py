"""The result of a private training run: :class:`TrainingResult` and its human-readable report.

``TrainingResult.summary()`` is the dictionary that ``dpnoise train --json`` prints and that
``metrics.json`` holds under ``"summary"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dpnoise.training.config import OPTIONS, TrainingConfig, non_default_fields
from dpnoise.training.report import RunHistory

if TYPE_CHECKING:  # annotations only
    import torch

    from dpnoise.training.engine import PrivacyEngine


class ConfiguredField:
    """A :class:`TrainingResult` attribute read from the run's configuration: the value of one dotted field
    in :attr:`TrainingResult.config`, or that field's default when the run left it at its default."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __get__(self, result: Optional["TrainingResult"], owner: type) -> Any:
        if result is None:
            return self
        return result.config[self.path] if self.path in result.config else OPTIONS[self.path].default


@dataclass(frozen=True)
class TrainingResult:
    """What a private training run reached, under which privacy setting, and what it wrote.

    The run's configuration is :attr:`config` (its fields that differ from their defaults); the settings a
    summary reports from it (``dataset``, ``batch_size``, ``momentum``, ...) are read from there."""

    #: the run's configuration: ``{dotted path: value}`` of its non-default fields
    #: (:func:`~dpnoise.training.config.non_default_fields`; :meth:`TrainingConfig.from_fields` builds it back)
    config: dict[str, Any]

    #: test accuracy at the last evaluation (None if no epoch was evaluated)
    test_accuracy: Optional[float]
    #: epsilon under the primary accountant
    epsilon: float
    epsilon_by_accountant: dict[str, float]
    #: whether each accountant's epsilon is a proven upper bound
    sound_by_accountant: dict[str, bool]
    #: the primary accountant (budget and headline epsilon)
    accountant: str
    delta: float
    target_epsilon: Optional[float]
    #: optimizer steps taken (across resumes) and planned (ceil(epochs / q))
    steps: int
    planned_steps: int
    #: whether the run stopped at the privacy budget
    budget_exhausted: bool
    mechanism: str
    train_size: int
    #: trainable parameters n
    params: int
    #: the noise, in the mechanism's own unit (``noise_unit``)
    noise: float
    noise_unit: str
    clip: float
    sample_rate: float
    #: learning rate in use (after the Dirichlet heuristic, if any)
    lr: float
    #: what the epsilon covers when it is not the trained parameters (output mechanisms), else None
    scope: Optional[str]
    grad_sample_mode: Optional[str]
    #: the device type the run trained on ("cpu" or "cuda") and the number of processes (ranks)
    device: str
    processes: int
    wall_time_s: float
    #: this process's rank (0 in one process); only rank 0 writes the files and prints
    rank: int = 0
    #: the mechanism's side parameters (:attr:`PrivacySetup.options`, e.g. the Dirichlet alpha and number of
    #: classes)
    options: dict[str, Any] = field(default_factory=dict)
    #: Dirichlet only: kappa(0.9; r, alpha), the gradient's attenuation
    kappa_at_0_9: Optional[float] = None
    #: the accountant that calibrated the noise (None: the noise was given)
    calibrated_with: Optional[str] = None
    #: how the noise and the Poisson sampling were seeded: "secret" (OS entropy) or "noise_seed" (reproducible)
    private_randomness: str = "secret"
    #: secure mode's release (``PrivacyEngine.secure_noise``: sampler, grid, inflated clip, inflation,
    #: noise in use); None outside secure mode
    secure_noise: Optional[dict[str, Any]] = None
    #: the curves: per-step (quick epsilon; the private batch's loss, accuracy and size only with
    #: ``output.log_private_batch_stats``) and per-epoch (test accuracy, epsilon by accountant) records
    history: RunHistory = field(default_factory=RunHistory)
    #: each trainable layer's per-example gradient source by "<path> (<type>)"
    #: (``PrivacyEngine.gradient_sources``; None for output mechanisms), in the summary when not all book-keeping
    gradient_sources: Optional[dict[str, str]] = None
    #: what the first step's per-example check found (:func:`per_example_check_statement`; None: not a
    #: gradient mechanism)
    per_example_check: Optional[str] = None
    #: why the epsilon does not cover the run (None: it does): batches that are not Poisson samples
    epsilon_not_covered: Optional[str] = None
    #: adaptive clipping's final threshold C_t and the count releases' cost
    #: (``PrivacyEngine.adaptive_clipping_report``); None for another clipping rule
    adaptive_clipping: Optional[dict[str, float]] = None
    #: the number of privacy units the epsilon protects whole (None: each example is its own unit)
    privacy_units: Optional[int] = None
    #: files written into the output folder
    files: tuple[Path, ...] = ()

    #: the settings every summary reports
    dataset = ConfiguredField("data.name")
    model = ConfiguredField("model")
    batch_size = ConfiguredField("schedule.batch_size")
    epochs = ConfiguredField("privacy.epochs")
    optimizer = ConfiguredField("optimizer.name")
    seed = ConfiguredField("seed")
    #: the optimisation recipe beyond the lr, in the summary when not the default: SGD momentum,
    #: lr schedule, EMA decay of the evaluated parameter average, physical batch size
    momentum = ConfiguredField("optimizer.momentum")
    lr_schedule = ConfiguredField("optimizer.lr_schedule")
    ema_decay = ConfiguredField("optimizer.ema_decay")
    physical_batch_size = ConfiguredField("execution.max_physical_batch_size")
    #: the noise multiplier of the features' per-channel statistics (released before training and
    #: included in every epsilon), when the features are standardised with them
    feature_statistics_noise = ConfiguredField("data.feature_statistics_noise")
    #: which of the model's parameters were trained (minilm), the LoRA rank, the image side (efficientnet
    #: models) and the evaluated split
    trainable = ConfiguredField("trainable")
    lora_rank = ConfiguredField("lora_rank")
    resolution = ConfiguredField("resolution")
    eval_split = ConfiguredField("data.eval_split")

    def summary(self) -> dict[str, Any]:
        """The run's result as one JSON-able dictionary (``dpnoise train --json``)."""
        summary = {name: getattr(self, name) for name in SUMMARY_FIELDS}
        summary.update(self.options)
        if self.kappa_at_0_9 is not None:
            summary["kappa_at_0.9"] = self.kappa_at_0_9
        if self.calibrated_with is not None:
            summary["calibrated_with"] = self.calibrated_with
        if self.secure_noise is not None:
            summary["secure_mode"] = True
            summary["secure_noise"] = self.secure_noise
        for name, default in {**OPTIONAL_FIELDS, **MODEL_FIELDS}.items():
            if getattr(self, name) != default:
                summary[name] = getattr(self, name)
        if self.gradient_sources and not all(source.startswith("book-keeping")
                                             for source in self.gradient_sources.values()):
            summary["gradient_sources"] = self.gradient_sources
        for name in ("per_example_check", "epsilon_not_covered", "adaptive_clipping", "privacy_units"):
            if getattr(self, name) is not None:
                summary[name] = getattr(self, name)
        if self.files:
            summary["files"] = [str(p) for p in self.files]
        return summary

    def metrics(self) -> dict[str, Any]:
        """What ``metrics.json`` holds: the summary (without the files) and the history."""
        summary = self.summary()
        summary.pop("files", None)
        return {"summary": summary, **self.history.to_dict()}


#: fields of :class:`TrainingResult` that every summary has, in its order
SUMMARY_FIELDS = (
    "test_accuracy", "epsilon", "epsilon_by_accountant", "sound_by_accountant", "accountant", "delta",
    "target_epsilon", "steps", "planned_steps", "budget_exhausted", "mechanism", "dataset", "model", "train_size",
    "params", "noise", "noise_unit", "clip", "sample_rate", "batch_size", "epochs", "optimizer", "lr", "seed",
    "scope", "grad_sample_mode", "device", "processes", "wall_time_s",
)
#: fields in the summary only when they differ from these defaults
OPTIONAL_FIELDS = {"momentum": 0.0, "lr_schedule": "constant", "ema_decay": None, "physical_batch_size": None,
                   "feature_statistics_noise": None, "private_randomness": "secret"}
#: the same, printed with the model
MODEL_FIELDS = {"trainable": None, "lora_rank": None, "resolution": None, "eval_split": "test"}


def summarize(
    config: TrainingConfig, engine: PrivacyEngine, optimizer: torch.optim.Optimizer, history: RunHistory,
    train_size: int, wall_time: float,
) -> TrainingResult:
    """The run's result, read from the engine, the optimizer and the history."""
    from dpnoise.accounting import ACCOUNTANTS
    from dpnoise.mechanisms import RUNNABLE_MECHANISMS, kappa
    from dpnoise.mechanisms.dirichlet import KAPPA_REFERENCE_PROBABILITY

    setup = engine.setup
    by_accountant = engine.epsilon_by_accountant()
    return TrainingResult(
        config=non_default_fields(config),
        test_accuracy=history.epochs[-1].test_accuracy if history.epochs else None,
        epsilon=by_accountant[setup.accountant],
        epsilon_by_accountant=by_accountant,
        sound_by_accountant={name: ACCOUNTANTS[name].sound for name in by_accountant},
        accountant=setup.accountant,
        delta=setup.delta,
        target_epsilon=setup.target_epsilon,
        steps=engine.steps,
        planned_steps=engine.planned_steps,
        budget_exhausted=engine.budget_exhausted,
        mechanism=setup.mechanism,
        train_size=train_size,
        params=setup.params,
        noise=setup.noise,
        noise_unit=RUNNABLE_MECHANISMS[setup.mechanism].spec.noise.unit,
        clip=setup.clip,
        sample_rate=setup.sample_rate,
        lr=optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"]),  # before any schedule
        scope=engine.scope_statement,
        grad_sample_mode=engine.grad_sample_mode,
        gradient_sources=engine.gradient_sources,
        per_example_check=per_example_check_statement(engine, config.execution.per_example_check),
        epsilon_not_covered=None if config.execution.poisson_sampling else (
            "poisson_sampling=False: the batches were shuffled fixed-size batches, which the accountants' "
            "Poisson sampling does not describe; no epsilon printed here covers this run"),
        device=engine.device.type,
        processes=engine.world_size,
        wall_time_s=wall_time,
        rank=engine.rank,
        options=setup.options,
        kappa_at_0_9=(kappa(KAPPA_REFERENCE_PROBABILITY, setup.noise, setup.options["alpha"])
                      if RUNNABLE_MECHANISMS[setup.mechanism].spec.effective_lr else None),
        calibrated_with=engine.calibration.accountant if engine.calibration is not None else None,
        private_randomness=engine.private_randomness,
        secure_noise=engine.secure_noise,
        adaptive_clipping=engine.adaptive_clipping_report(),
        privacy_units=setup.privacy_units,
        history=history,
    )


def report_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable report of a summary (:meth:`TrainingResult.summary`, or metrics.json's).

    The noise is rounded toward more privacy and the clip down (Lap2's privacy depends on b / C), so
    that the printed values fed back to ``--noise`` and ``--clip`` give no more than the epsilon shown;
    each epsilon is rounded up at its last decimal, so that none reads below the bound it stands for.
    """
    from dpnoise.accounting import get_mechanism_spec
    from dpnoise.formatting import decimals, significant_digits

    accuracy, split = summary["test_accuracy"], summary.get("eval_split", "test")
    noise = get_mechanism_spec(summary["mechanism"]).noise.printed(summary["noise"])
    lines = [
        (f"{split} accuracy: not evaluated (no step trained in this run)" if accuracy is None else
         f"{split} accuracy: {accuracy:.4f}")
        + f"  ({summary['dataset']}, model {summary['model']}, "
        f"{summary['steps']} steps, {summary['wall_time_s']:.0f} s on {summary['device']}"
        + (f", {summary['processes']} processes)" if summary["processes"] > 1 else ")"),
        f"mechanism {summary['mechanism']}: noise {noise} ({summary['noise_unit']}), "
        f"clip {significant_digits(summary['clip'], 6, 'down')}, sample rate {summary['sample_rate']:.6g}, "
        f"lr {summary['lr']:.3g}"
        + "".join(f", {name.replace('_', ' ')} {summary[name]}" for name in OPTIONAL_FIELDS if name in summary),
        f"model: {summary['params']:,} trained parameters"
        + "".join(f", {name.replace('_', ' ')} {summary[name]}" for name in MODEL_FIELDS if name in summary)
        + (f"; per-example gradients by {summary['grad_sample_mode']}" if summary["grad_sample_mode"] else ""),
    ]
    if "gradient_sources" in summary:
        lines.append(gradient_sources_line(summary["gradient_sources"]))
    if "per_example_check" in summary:
        lines.append(f"per-example check: {summary['per_example_check']}")
    if "epsilon_not_covered" in summary:
        lines.append(f"WARNING: {summary['epsilon_not_covered']}")
    if summary.get("secure_mode"):
        secure = summary["secure_noise"]
        lines.append(f"secure mode: {secure['sampler']} noise from {secure['random_bytes']} on the grid "
                     f"2^{math.log2(secure['grid']):.0f}; the clipped sum's rounding inflates the clip to "
                     f"{significant_digits(secure['inflated_clip'], 6, 'up')}, the noise is raised by the factor "
                     f"{significant_digits(secure['inflation'], 8, 'up')}")
    units = summary.get("privacy_units")
    lines.append(f"epsilon at delta={summary['delta']:g}" + ("" if units is None else
                 f", per privacy unit (each of the {units} units with all its examples)") + ":")
    for name, eps in summary["epsilon_by_accountant"].items():
        role = "primary" if name == summary["accountant"] else "side by side"
        validity = "proven upper bound" if summary["sound_by_accountant"][name] else "NOT a valid privacy bound"
        if summary["scope"] and summary["sound_by_accountant"][name]:
            validity += " for the released outputs only, see scope"
        lines.append(f"  {name:>22}: {decimals(eps, 4, 'up')}  ({role}; {validity})")
    if "adaptive_clipping" in summary:
        adaptive = summary["adaptive_clipping"]
        lines.append(f"adaptive clipping: C from {significant_digits(summary['clip'], 6, 'down')} to "
                     f"{adaptive['final_clip']:.6g}; the epsilon above covers the gradients and the noisy counts "
                     f"together, the gradients alone {decimals(adaptive['epsilon_without_count'], 4, 'up')}, the "
                     f"counts alone {decimals(adaptive['epsilon_of_count'], 4, 'up')} ({summary['accountant']})")
    if summary["budget_exhausted"]:
        lines.append(f"stopped at the privacy budget epsilon={summary['target_epsilon']:g} after {summary['steps']} steps")
    if summary["scope"]:
        lines.append(summary["scope"])
    if summary.get("files"):
        lines.append("wrote " + ", ".join(summary["files"]))
    return lines


#: layers named per gradient source in the report (metrics.json names them all)
LAYERS_NAMED_PER_SOURCE = 8


def per_example_check_statement(engine: "PrivacyEngine", asked: bool) -> Optional[str]:
    """One line on the first step's per-example check (None for the output mechanisms, which it does not cover)."""
    if engine.grad_sample_mode is None:
        return None
    if not asked:
        return "skipped (--no-per-example-check): nothing checked that each example's gradient is its own"
    report = engine.per_example_report
    if report is None:
        return "not run (no physical batch of 2 or more examples was trained in this process)"
    return (f"passed on examples {', '.join(map(str, report.examples))} of the first batch (largest relative "
            f"error {max(report.exactness.error, report.independence.error):.1e})")


def gradient_sources_line(sources: dict[str, str]) -> str:
    """The layers of each per-example gradient source, e.g. ``"per-example gradients by layer: hooks, grad
    sampler: conv (Conv2d), fc (Linear); hooks, functorch: scale (Scale)"``."""
    by_source: dict[str, list[str]] = {}
    for layer, source in sources.items():
        by_source.setdefault(source, []).append(layer)
    parts = []
    for source, layers in by_source.items():
        more = len(layers) - LAYERS_NAMED_PER_SOURCE
        parts.append(f"{source}: " + ", ".join(layers[:LAYERS_NAMED_PER_SOURCE])
                     + (f" and {more} more" if more > 0 else ""))
    return "per-example gradients by layer: " + "; ".join(parts)
