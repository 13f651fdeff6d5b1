"""Run records of a private training run and the files ``dpnoise train --out`` writes.

``metrics.json`` (settings, summary, per-step and per-epoch records), ``steps.csv``,
``epochs.csv`` and ``curves.png`` (accuracy and epsilon against steps).
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step: training-batch loss/accuracy and a sound upper bound on the primary
    epsilon so far (``PrivacyEngine.get_quick_epsilon``: the RDP routes of the default accountants;
    the epoch records hold every accountant's exact value)."""

    step: int
    epoch: float
    loss: float
    batch_accuracy: float
    batch_size: int
    epsilon: float


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
        return {"steps": [asdict(s) for s in self.steps], "epochs": [asdict(e) for e in self.epochs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunHistory":
        return cls([StepRecord(**s) for s in data["steps"]], [EpochRecord(**e) for e in data["epochs"]])


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of equal keys as CSV with a header (nothing but the header when empty)."""
    with path.open("w", newline="") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def flatten_epoch(record: EpochRecord) -> dict[str, Any]:
    """An epoch record with one ``epsilon_<accountant>`` column per accountant."""
    row = {"epoch": record.epoch, "step": record.step, "test_accuracy": record.test_accuracy}
    row.update({f"epsilon_{name}": eps for name, eps in record.epsilon_by_accountant.items()})
    return row


def plot_curves(path: Path, history: RunHistory, title: str) -> None:
    """PNG with test/batch accuracy (left) and epsilon per accountant (right) against steps."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (acc_ax, eps_ax) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [s.step for s in history.steps]
    acc_ax.plot(steps, [s.batch_accuracy for s in history.steps], lw=0.6, alpha=0.5, label="training batch")
    acc_ax.plot([e.step for e in history.epochs], [e.test_accuracy for e in history.epochs], "o-", label="test")
    acc_ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="accuracy")
    acc_ax.legend()
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
    write_csv(paths[1], [asdict(s) for s in history.steps])
    write_csv(paths[2], [flatten_epoch(e) for e in history.epochs])
    plot_curves(paths[3], history, f"{summary['mechanism']} on {summary['dataset']}")
    return paths
