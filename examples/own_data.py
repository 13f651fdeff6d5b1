"""Private training on your own data: a CSV of texts with string labels and a folder of images per class.

Writes both into a temporary folder (a stand-in for your files), then trains on each with
``dpnoise.training.train_private`` as ``dpnoise train --dataset csv:PATH`` / ``imagefolder:PATH`` does, and
prints the accuracy, the epsilon and the label names.

    python examples/own_data.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from dpnoise.training import TrainingConfig, train_private


def write_reviews(folder: Path) -> Path:
    words = {"pos": ("great", "good", "lovely"), "neg": ("bad", "awful", "poor"), "mid": ("okay", "plain", "average")}
    rows = ["opinion,stars"] + [f"a {w[i % 3]} and {w[(i + 1) % 3]} film {i},{k}" for i in range(150)
                                for k, w in words.items()]
    path = folder / "reviews.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def write_pictures(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    for name, level in (("dark", 40), ("grey", 128), ("light", 220)):
        (folder / "pictures" / name).mkdir(parents=True)
        for i in range(60):
            Image.fromarray(np.clip(rng.normal(level, 25, (12, 12)), 0, 255).astype(np.uint8)).save(
                folder / "pictures" / name / f"{i}.png")
    return folder / "pictures"


def main(argv: list[str] | None = None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="own-data-"))
    runs = {
        "csv": {"data.name": f"csv:{write_reviews(folder)}", "data.text_column": "opinion",
                "data.label_column": "stars", "model": "minilm-features", "optimizer.lr": 0.1},
        "imagefolder": {"data.name": f"imagefolder:{write_pictures(folder)}", "model": "cnn", "optimizer.lr": 0.01},
    }
    results = {}
    for kind, fields in runs.items():
        config = TrainingConfig.from_fields({**fields, "privacy.mechanism": "gaussian", "privacy.delta": 1e-5,
                                             "privacy.target_epsilon": 3.0, "privacy.epochs": 3.0,
                                             "schedule.batch_size": 32, "output.progress": False,
                                             "output.folder": folder / f"run-{kind}", "threads": 1})
        result = train_private(config)
        labels = json.loads((folder / f"run-{kind}" / "labels.json").read_text())["labels"]
        results[kind] = {"accuracy": result.test_accuracy, "epsilon": result.epsilon, "labels": labels}
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
