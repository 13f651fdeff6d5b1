"""Private supervised fine-tuning of a small causal language model through dpnoise's PrivateSFTTrainer.

A GPT-2 configuration (2 layers, width 128, MiniLM-L6's tokenizer and vocabulary; no pretrained causal LM is
installable offline) trained from its random initialisation on SST-2's training sentences as plain text
(full-sequence loss, each sequence's own), at epsilon 3 and 8 (delta 1e-5; Gaussian, clip 1, Adam 1e-3,
T = 200 Poisson batches of 64 expected sentences cut to 48 tokens) and without privacy (TRL's SFTTrainer, the
same batches' size and steps); the score is the perplexity of SST-2's 872 dev sentences.  One record per
run in ``reproductions/results/private-sft/``::

    .venv/bin/python -m reproductions.private_sft_sst2 --epsilons 3 8 0
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "private-sft"
STEPS, BATCH, LENGTH, WIDTH, LAYERS, LR, CLIP, DELTA = 200, 64, 48, 128, 2, 1e-3, 1.0, 1e-5


def sentences(split: str):
    from datasets import Dataset

    from dpnoise.data import load_dataset

    return Dataset.from_dict({"text": list(load_dataset("sst2", split).sentences)})


def run(epsilon: float, seed: int, steps: int, threads: int) -> dict:
    import torch
    import transformers
    from trl import SFTConfig, SFTTrainer

    from dpnoise.data import minilm_tokenizer
    from dpnoise.huggingface import PrivateSFTTrainer

    torch.set_num_threads(threads)
    tokenizer = minilm_tokenizer()
    tokenizer.eos_token = tokenizer.sep_token  # a BERT tokenizer: [SEP] ends a sentence
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tokenizer.vocab_size, n_embd=WIDTH, n_layer=LAYERS, n_head=4, n_positions=LENGTH + 2,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id))
    config = SFTConfig(output_dir=tempfile.mkdtemp(prefix="private-sft-"), per_device_train_batch_size=BATCH,
                       max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", max_length=LENGTH,
                       logging_steps=50, save_strategy="no", report_to=[], use_cpu=True, seed=seed, disable_tqdm=True,
                       per_device_eval_batch_size=128, dataset_text_field="text")
    train = sentences("train")
    common = dict(model=model, args=config, train_dataset=train, eval_dataset=sentences("dev"),
                  processing_class=tokenizer)
    if epsilon > 0:
        trainer = PrivateSFTTrainer(**common, noise_seed=seed, privacy={
            "mechanism": "gaussian", "delta": DELTA, "target_epsilon": epsilon, "max_grad_norm": CLIP})
    else:
        trainer = SFTTrainer(**common)
    started = time.perf_counter()
    trainer.train()
    loss = trainer.evaluate()["eval_loss"]
    engine = getattr(trainer, "privacy_engine", None)
    return {"experiment": "private-sft", "seed": seed, "target_epsilon": epsilon or None,
            "dev_perplexity": math.exp(loss), "dev_loss": loss,
            "epsilon": engine.get_epsilon() if engine else None, "delta": DELTA if engine else None,
            "noise": engine.setup.noise if engine else None, "sample_rate": engine.setup.sample_rate if engine else None,
            "steps": engine.steps if engine else trainer.state.global_step, "train_sentences": len(train),
            "model": f"gpt2 config, {LAYERS} layers, width {WIDTH}, vocabulary {tokenizer.vocab_size}",
            "parameters": sum(p.numel() for p in model.parameters()), "wall_time_s": time.perf_counter() - started,
            "host": platform.node(),
            "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                         cwd=HERE).stdout.strip(),
            "command": f".venv/bin/python -m reproductions.private_sft_sst2 --epsilons {epsilon:g} --seed {seed} "
                       f"--threads {threads}" + (f" --steps {steps}" if steps != STEPS else "")}


def summary(results: Path) -> str:
    """Dev perplexity per run (the private runs by epsilon, the non-private one last)."""
    records = sorted((json.loads(path.read_text()) for path in results.glob("*.json")),
                     key=lambda r: (r["target_epsilon"] is None, r["target_epsilon"] or 0, r["seed"]))
    rows = [[_run_name(r), str(r["seed"]), str(r["steps"]), f"{r['dev_perplexity']:.1f}",
             "—" if r["noise"] is None else f"{r['noise']:.4g}"] for r in records]
    lines = ["| run | seed | steps | dev perplexity | noise σ |", "|---|---|---|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _run_name(record: dict) -> str:
    return "non-private" if record["target_epsilon"] is None else f"ε = {record['epsilon']:.3g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", type=float, nargs="+", default=[3.0, 8.0, 0.0],
                   help="target epsilons; 0 trains without privacy (default 3 8 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the records go")
    p.add_argument("--figures-dir", type=Path, default=HERE / "reports", help="where the summary table goes "
                   "(default: reproductions/reports/)")
    args = p.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    for epsilon in args.epsilons:
        name = f"eps{epsilon:g}" if epsilon > 0 else "non-private"
        path = args.results / f"{name}_T{args.steps}_seed{args.seed}.json"
        if path.exists():
            continue
        path.write_text(json.dumps(run(epsilon, args.seed, args.steps, args.threads), indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    from reproductions.reports import write_markdown

    written = write_markdown(args.figures_dir / "summary_private_sft.md", "Private SFT of a GPT-2 configuration on "
                             "SST-2 sentences: dev perplexity", summary(args.results))
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
