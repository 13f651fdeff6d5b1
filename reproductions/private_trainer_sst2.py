"""MiniLM-L6 fully fine-tuned on SST-2 through dpnoise's private Trainer, beside the same runs through
``dpnoise train`` (the finetune-full records: Gaussian, epsilon 3.74 at delta 1e-5, T = 300 Poisson
batches of 128 expected sentences cut to 32 tokens, Adam lr 5e-4 constant, clip 0.1, every parameter
trained, evaluated on the 872 dev sentences, seeds 0-2).

The Trainer run uses the same data set object (:func:`dpnoise.training.preparation.load_splits`), model
builder, optimizer settings and seeds (public seed and noise seed), physical batches of 64; one record per
seed in ``reproductions/results/private-trainer/``:

    .venv/bin/python -m reproductions.private_trainer_sst2 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "private-trainer"
EPSILON, STEPS, BATCH, LENGTH, LR, CLIP = 3.74, 300, 128, 32, 5e-4, 0.1


def run(seed: int, physical: int, threads: int, steps: int = STEPS) -> dict:
    import torch
    import transformers

    from dpnoise.huggingface import PrivateTrainer
    from dpnoise.models import minilm_sequence_classifier
    from dpnoise.training import TrainingConfig
    from dpnoise.training.preparation import batch_collation, load_splits

    torch.set_num_threads(threads)
    config = TrainingConfig.from_fields({"data.name": "sst2", "data.max_length": LENGTH, "data.eval_split": "dev",
                                         "model": "minilm", "trainable": "all", "privacy.mechanism": "gaussian",
                                         "privacy.delta": 1e-5, "privacy.noise": 1.0, "privacy.epochs": 1.0,
                                         "schedule.batch_size": BATCH})
    train, dev = load_splits(config)
    torch.manual_seed(seed)
    model = minilm_sequence_classifier(trainable="all")
    out = tempfile.mkdtemp(prefix="private-trainer-")
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=physical, gradient_accumulation_steps=BATCH // physical,
        max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0, logging_steps=50,
        save_strategy="no", report_to=[], use_cpu=True, seed=seed, disable_tqdm=True, eval_strategy="no",
        per_device_eval_batch_size=256)

    def accuracy(prediction):
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    trainer = PrivateTrainer(model, args, train_dataset=train, eval_dataset=dev, compute_metrics=accuracy,
                             data_collator=batch_collation(train)["collate_fn"], noise_seed=seed,
                             privacy={"mechanism": "gaussian", "delta": 1e-5, "target_epsilon": EPSILON,
                                      "max_grad_norm": CLIP})
    started = time.perf_counter()
    trainer.train()
    metrics = trainer.evaluate()
    engine = trainer.privacy_engine
    return {"experiment": "private-trainer", "seed": seed, "accuracy": metrics["eval_accuracy"],
            "epsilon": engine.get_epsilon(), "delta": engine.setup.delta, "noise": engine.setup.noise,
            "steps": engine.steps, "sample_rate": engine.setup.sample_rate, "physical_batch_size": physical,
            "wall_time_s": time.perf_counter() - started, "host": platform.node(),
            "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                         cwd=HERE).stdout.strip(),
            "command": f".venv/bin/python -m reproductions.private_trainer_sst2 --seeds {seed} --physical {physical} "
                       f"--threads {threads}" + (f" --steps {steps}" if steps != STEPS else "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--physical", type=int, default=64, help="examples per forward pass (default 64)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=STEPS, help=f"Poisson batches T (default {STEPS}, the records')")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the records go")
    args = p.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        path = args.results / f"sst2_minilm_gaussian_eps{EPSILON:g}_T{args.steps}_B{BATCH}_train-all_L{LENGTH}_seed{seed}.json"
        if path.exists():
            continue
        record = run(seed, args.physical, args.threads, args.steps)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
