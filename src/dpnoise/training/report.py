"""Run records of a private training run and the files ``dpnoise train --out`` writes.

``metrics.json`` (settings, summary, per-step and per-epoch records), ``steps.csv``,
``epochs.csv`` and ``curves.png`` (accuracy and epsilon against steps).  A step record holds the
step, its epoch and its epsilon; the loss, accuracy and size of the step's private batch
(:data:`PRIVATE_BATCH_STATS`), which are computed without noise and are not covered by the
epsilon, only when the run asks for them (``OutputConfig.log_private_batch_stats``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

#: the fields of a step record computed from its private batch without noise (outside the epsilon)
PRIVATE_BATCH_STATS = ("loss", "batch_accuracy", "batch_size")


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step: its epoch (step x sample rate) and a sound upper bound on the primary
    epsilon so far (``PrivacyEngine.get_quick_epsilon``: the RDP routes of the default accountants;
    the epoch records hold every accountant's exact value).

    The loss, accuracy and size of the step's private batch are None unless the run logs them
    (``OutputConfig.log_private_batch_stats``); they are keyword-only so that the fields keep the
    column order of ``steps.csv``.
    """

    step: int
    epoch: float
    loss: Optional[float] = field(default=None, kw_only=True)
    batch_accuracy: Optional[float] = field(default=None, kw_only=True)
    batch_size: Optional[int] = field(default=None, kw_only=True)
    epsilon: float

    def to_dict(self) -> dict[str, Any]:
        """The record's fields, the private batch's statistics only where it holds them."""
        return {name: value for name, value in asdict(self).items()
                if name not in PRIVATE_BATCH_STATS or value is not None}


@dataclass(frozen=True)
class EpochRecord:
    """An evaluation point: test accuracy and the epsilon under every accountant."""

    epoch: float
    step: int
    test_accuracy: float
    epsilon_by_accountant: dict[str, float]


@dataclass
class RunHistory:
    """Everything recorded during a run (kept in checkpoints so a resumed run keeps its past)."""

    steps: list[StepRecord] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [s.to_dict() for s in self.steps], "epochs": [asdict(e) for e in self.epochs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, private_batch_stats: bool) -> "RunHistory":
        """The history :meth:`to_dict` gave (a checkpoint's); the step records keep the statistics of their
        private batches, where they hold them, only with ``private_batch_stats``."""
        steps = [StepRecord(**{name: value for name, value in s.items()
                               if private_batch_stats or name not in PRIVATE_BATCH_STATS}) for s in data["steps"]]
        return cls(steps, [EpochRecord(**e) for e in data["epochs"]])


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as CSV under a header of every key, in the order first met (a row without a key leaves its
    cell empty); an empty file when there are no rows."""
    with path.open("w", newline="") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)


def flatten_epoch(record: EpochRecord) -> dict[str, Any]:
    """An epoch record with one ``epsilon_<accountant>`` column per accountant."""
    row = {"epoch": record.epoch, "step": record.step, "test_accuracy": record.test_accuracy}
    row.update({f"epsilon_{name}": eps for name, eps in record.epsilon_by_accountant.items()})
    return row


def plot_curves(path: Path, history: RunHistory, title: str) -> None:
    """PNG with the test accuracy, and the training-batch accuracy where the steps hold it (left), and
    epsilon per accountant (right) against steps."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (acc_ax, eps_ax) = plt.subplots(1, 2, figsize=(11, 4))
    logged = [s for s in history.steps if s.batch_accuracy is not None]
    if logged:
        acc_ax.plot([s.step for s in logged], [s.batch_accuracy for s in logged], lw=0.6, alpha=0.5,
                    label="training batch (no noise, outside epsilon)")
    acc_ax.plot([e.step for e in history.epochs], [e.test_accuracy for e in history.epochs], "o-", label="test")
    acc_ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="accuracy")
    acc_ax.legend()
    steps = [s.step for s in history.steps]
    eps_ax.plot(steps, [s.epsilon for s in history.steps], lw=1.0, label="primary accountant (per step: quick bound)")
    names = list(history.epochs[0].epsilon_by_accountant) if history.epochs else []
    for name in names:
        eps_ax.plot([e.step for e in history.epochs], [e.epsilon_by_accountant[name] for e in history.epochs],
                    "o", label=name)
    eps_ax.set(xlabel="step", ylabel="epsilon", title="epsilon spent")
    eps_ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_run_outputs(out_dir: Path, summary: dict[str, Any], history: RunHistory) -> list[Path]:
    """Write metrics.json, steps.csv, epochs.csv and curves.png into ``out_dir``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ("metrics.json", "steps.csv", "epochs.csv", "curves.png")]
    paths[0].write_text(json.dumps({"summary": summary, **history.to_dict()}, indent=1))
    write_csv(paths[1], [s.to_dict() for s in history.steps])
    write_csv(paths[2], [flatten_epoch(e) for e in history.epochs])
    plot_curves(paths[3], history, f"{summary['mechanism']} on {summary['dataset']}")
    return paths
