"""What one experiment run is (:class:`RunSpec`), where its record lives, and how records aggregate.

One finished run = one JSON record ``<results>/<experiment>/<name>.json`` (one per seed); the
aggregation groups records that differ only in the seed and reports mean / std of the accuracy.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Optional

#: Record keys that identify a configuration (everything but the seed).
GROUP_KEYS = (
    "experiment", "dataset", "model", "mechanism", "calibrated_with", "target_epsilon",
    "steps_planned", "optimizer", "alpha", "effective_lr", "momentum", "lr_schedule", "ema_decay",
    "feature_statistics_noise", "trainable", "max_length", "eval_split", "resolution", "clipping",
)
#: what a record written before a group key existed held (the setting that was then the only one)
GROUP_KEY_DEFAULTS = {"clipping": "flat"}


def group_value(record: dict[str, Any], key: str) -> Any:
    """``record``'s value of the group key ``key`` (older records: :data:`GROUP_KEY_DEFAULTS`)."""
    return record.get(key, GROUP_KEY_DEFAULTS.get(key))


def configured(path: str, default: Any = MISSING, tag: Optional[str] = None) -> Any:
    """A :class:`RunSpec` field that is the training configuration's field at the dotted ``path``
    (:meth:`dpnoise.training.TrainingConfig.from_fields`; several paths are separated by commas); ``tag``
    formats its value into the record's name where it is not the default."""
    return field(default=default, metadata={"config": tuple(path.split(",")), **({"tag": tag} if tag else {})})


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment: the experiment's name, the planned steps and the run's training
    configuration fields (each field names its configuration path; the noise is calibrated, not given).

    ``steps`` is the planned number of Poisson-sampled steps T: the noise is calibrated so that
    ``target_epsilon`` is reached after T steps under ``calibrated_with``, which is also the
    accountant that enforces the budget.  ``lr`` is ignored when ``effective_lr`` is set
    (Dirichlet only: lr = effective_lr / kappa(0.9; r, alpha), docs/theory/dirichlet.md §4).
    ``train_limit`` trains on a deterministic class-balanced subset (it changes q = batch / N).
    ``seed`` is the public seed and the noise seed (a reproduction is reproducible).
    """

    experiment: str
    dataset: str = configured("data.name")
    model: str = configured("model")
    mechanism: str = configured("privacy.mechanism")
    calibrated_with: str = configured("privacy.accountant,privacy.calibrate_with")
    target_epsilon: float = configured("privacy.target_epsilon")
    seed: int = configured("seed,noise_seed")
    #: the configuration's privacy.epochs is the E with ceil(E / q) = steps (:func:`reproductions.runner.train_config`)
    steps: int = field(default=MISSING)
    batch_size: int = configured("schedule.batch_size")
    delta: float = configured("privacy.delta", 1e-5)
    clip: float = configured("privacy.max_grad_norm", 1.0)
    optimizer: str = configured("optimizer.name", "adam")
    lr: float = configured("optimizer.lr", 1e-3)
    weight_decay: float = configured("optimizer.weight_decay", 0.0)
    label_smoothing: float = configured("optimizer.label_smoothing", 0.0)
    effective_lr: Optional[float] = configured("optimizer.effective_lr", None)
    test_limit: Optional[int] = configured("data.test_limit", None)
    #: physical batches of a logical batch (memory only: the step is the same)
    physical_batch_size: Optional[int] = configured("execution.max_physical_batch_size", None)
    # the fields below name the record when they are not their defaults, in this order (``tag``)
    alpha: Optional[float] = configured("privacy.options.alpha", None, tag="alpha{:g}")
    momentum: float = configured("optimizer.momentum", 0.0, tag="m{:g}")
    lr_schedule: str = configured("optimizer.lr_schedule", "constant", tag="{}")
    ema_decay: Optional[float] = configured("optimizer.ema_decay", None, tag="ema{:g}")
    #: standardise the features with per-channel statistics released with this Gaussian noise
    #: multiplier (scatternet models; the release is in every epsilon); None: GroupNorm
    feature_statistics_noise: Optional[float] = configured("data.feature_statistics_noise", None, tag="fstat{:g}")
    train_limit: Optional[int] = configured("data.limit", None, tag="N{}")
    #: minilm only: which parameters are fine-tuned (``dpnoise train --trainable``); None: the library's default
    trainable: Optional[str] = configured("trainable", None, tag="train-{}")
    #: text datasets: sentences cut to this many tokens (``--max-length``); None: the library's default
    max_length: Optional[int] = configured("data.max_length", None, tag="L{}")
    #: the split evaluated (``--eval-split``, e.g. sst2's ``dev``); None: the test split
    eval_split: Optional[str] = configured("data.eval_split", None, tag="eval-{}")
    #: efficientnet models: the image side (``--resolution``); None: the library's default
    resolution: Optional[int] = configured("resolution", None, tag="px{}")
    #: the per-example clipping rule (``--clipping``): "flat" (min(1, C/||g||)) or "automatic"
    clipping: str = configured("privacy.clipping", "flat", tag="clipping-{}")

    def configuration_fields(self) -> dict[str, Any]:
        """``{dotted configuration path: value}`` of the fields given (not None), ``lr`` left out where
        ``effective_lr`` replaces it (:meth:`dpnoise.training.TrainingConfig.from_fields`)."""
        found: dict[str, Any] = {}
        for spec_field in fields(self):
            value = getattr(self, spec_field.name)
            if value is None or (spec_field.name == "lr" and self.effective_lr is not None):
                continue
            found.update((path, value) for path in spec_field.metadata.get("config", ()))
        return found

    @property
    def name(self) -> str:
        """File stem of the record: unique within the experiment for every differing field."""
        parts = [self.dataset, self.model, self.mechanism, f"cal-{self.calibrated_with}",
                 f"eps{self.target_epsilon:g}", f"T{self.steps}", f"B{self.batch_size}", self.optimizer,
                 f"elr{self.effective_lr:g}" if self.effective_lr is not None else f"lr{self.lr:g}"]
        for spec_field in fields(self):
            value = getattr(self, spec_field.name)
            if "tag" in spec_field.metadata and value != spec_field.default:
                parts.append(spec_field.metadata["tag"].format(value))
        parts.append(f"seed{self.seed}")
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_path(results_dir: Path, spec: RunSpec) -> Path:
    """Where the record of ``spec`` is (or will be) written."""
    return Path(results_dir) / spec.experiment / f"{spec.name}.json"


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` atomically (a killed batch never leaves a half-written record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    partial.replace(path)


#: Derived files kept beside the records (see :mod:`reproductions.lower_bounds`).
LOWER_BOUNDS_FILE = "lower_bounds.json"


def load_records(results_dir: Path, experiment: str) -> list[dict[str, Any]]:
    """Every per-run record of ``experiment`` (aggregate and lower-bound files excluded), sorted by name."""
    folder = Path(results_dir) / experiment
    paths = sorted(p for p in folder.glob("*.json")
                   if not p.name.startswith("aggregate") and p.name != LOWER_BOUNDS_FILE)
    return [json.loads(p.read_text()) for p in paths]


def mean_std(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation (None for a single value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def aggregate(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration (records equal on :data:`GROUP_KEYS`): accuracy mean/std over seeds.

    Runs whose target was unreachable are kept as rows with ``status = "unreachable"`` and no
    accuracy.  Epsilons and noise are deterministic given the configuration, so the first
    record's values are reported.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(tuple(group_value(record, k) for k in GROUP_KEYS), []).append(record)
    rows = []
    for members in groups.values():
        first = members[0]
        row = {k: group_value(first, k) for k in GROUP_KEYS}
        row.update(status=first["status"], seeds=sorted(m["seed"] for m in members), n_seeds=len(members))
        if first["status"] == "ok":
            accuracies = [m["accuracy"] for m in sorted(members, key=lambda m: m["seed"])]
            row["accuracy_mean"], row["accuracy_std"] = mean_std(accuracies)
            row.update(
                accuracies=accuracies,
                noise=first["noise"],
                noise_unit=first["noise_unit"],
                clip=first.get("clip"),
                delta=first.get("delta"),
                sample_rate=first.get("sample_rate"),
                params=first.get("params"),
                lr=first["lr"],
                epsilon_by_accountant=first["epsilon_by_accountant"],
                steps=sorted({m["steps"] for m in members}),
                wall_time_s_mean=statistics.fmean(m["wall_time_s"] for m in members),
                git_commits=sorted({(m["git_commit"] or "unknown")[:7] + ("+dirty" if m["git_src_dirty"] else "")
                                    for m in members}),
                commands=[m["command"] for m in sorted(members, key=lambda m: m["seed"])],
                scope=first.get("scope"),
            )
        else:
            row["reason"] = first["reason"]
        rows.append(row)
    return sorted(rows, key=_row_order)


def _row_order(row: dict[str, Any]) -> tuple:
    return tuple("" if row.get(k) is None else str(row[k]) if isinstance(row[k], str) else f"{row[k]:020.6f}"
                 for k in GROUP_KEYS)


@dataclass(frozen=True)
class PairedDifference:
    """Accuracy of one configuration minus another's, seed by seed, over the seeds both ran."""

    mean: float
    std: Optional[float]
    positive: int  # seeds where the difference is > 0
    n: int


def paired_difference(first: dict[str, Any], second: dict[str, Any]) -> Optional[PairedDifference]:
    """``first`` minus ``second`` (aggregated rows) paired by seed, or None without a common seed.

    A seed fixes the initialisation and the Poisson batches, so pairing by seed removes that part
    of the run-to-run spread from a comparison of two mechanisms.
    """
    if first["status"] != "ok" or second["status"] != "ok":
        return None
    by_seed = dict(zip(second["seeds"], second["accuracies"]))
    differences = [a - by_seed[s] for s, a in zip(first["seeds"], first["accuracies"]) if s in by_seed]
    if not differences:
        return None
    mean, std = mean_std(differences)
    return PairedDifference(mean, std, sum(d > 0 for d in differences), len(differences))


def write_aggregate(results_dir: Path, experiment: str) -> Path:
    """Aggregate ``experiment``'s records into ``<results>/<experiment>/aggregate.json``."""
    rows = aggregate(load_records(results_dir, experiment))
    path = Path(results_dir) / experiment / "aggregate.json"
    write_record(path, {"experiment": experiment, "rows": rows})
    return path


def format_accuracy(row: Optional[dict[str, Any]]) -> str:
    """``97.12 ± 0.10 (n=3)`` in percent, ``unreachable`` or ``—`` (not run)."""
    if row is None:
        return "—"
    if row["status"] != "ok":
        return row["status"]
    mean, std = 100 * row["accuracy_mean"], row["accuracy_std"]
    if std is None or math.isnan(std):
        return f"{mean:.2f} (n=1)"
    return f"{mean:.2f} ± {100 * std:.2f} (n={row['n_seeds']})"
