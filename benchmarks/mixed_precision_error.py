"""How far the clipped sum of a private step in bfloat16 is from float32's, on MiniLM-L6 and SST-2.

The same batch (16 SST-2 training sentences, 32 tokens), the same weights, book-keeping's per-example
norms and clipped sums (clipping norm 0.1, as in the fine-tuning experiments) in three precisions:
float32 (the reference), float32 weights under ``torch.autocast(bfloat16)``, and bfloat16 weights.  The
error of a clipped sum is ||S - S_32|| / ||S_32|| over all parameters; of the norms, the largest
relative error.  Prints one JSON object.

    .venv/bin/python benchmarks/mixed_precision_error.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json

import torch

from dpnoise.mechanisms.clipping import clip_factors
from dpnoise.training.bookkeeping import BookkeepingModule

BATCH, LENGTH, CLIP = 16, 32, 0.1


def clipped_step(model: torch.nn.Module, batch: dict, autocast: bool, device: str) -> tuple[torch.Tensor, list]:
    """Per-example L2 norms and the clipped sums of ``model`` on ``batch`` (float32 results)."""
    wrapped = BookkeepingModule(model)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        loss = wrapped(**batch).loss
    loss.backward()
    norms = wrapped.per_example_norms(2).float()
    sums = [s.float() for s in wrapped.clipped_sums(params, clip_factors(norms, CLIP))]
    return norms, sums


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = p.parse_args()
    from dpnoise.data import load_dataset, minilm_tokenizer
    from dpnoise.models import minilm_sequence_classifier

    data = load_dataset("sst2", "train", limit=BATCH)
    batch = dict(minilm_tokenizer()(list(data.sentences[:BATCH]), padding="max_length", truncation=True,
                                    max_length=LENGTH, return_tensors="pt"))
    batch["labels"] = torch.as_tensor([int(label) for label in data.labels[:BATCH]])
    batch = {name: value.to(args.device) for name, value in batch.items()}
    results = {}
    reference = None
    for name, autocast, dtype in (("float32", False, torch.float32), ("autocast-bfloat16", True, torch.float32),
                                  ("bfloat16-weights", False, torch.bfloat16)):
        torch.manual_seed(0)
        model = minilm_sequence_classifier(trainable="all").to(args.device, dtype)
        norms, sums = clipped_step(model, batch, autocast, args.device)
        if reference is None:
            reference = (norms, sums)
            continue
        difference = torch.sqrt(sum(((s - r) ** 2).sum() for s, r in zip(sums, reference[1])))
        size = torch.sqrt(sum((r ** 2).sum() for r in reference[1]))
        results[name] = {"clipped_sum_relative_error": float(difference / size),
                         "largest_norm_relative_error": float(((norms - reference[0]).abs() / reference[0]).max())}
    print(json.dumps({"device": args.device, "batch": BATCH, "tokens": LENGTH, "clip": CLIP, **results}, indent=1))


if __name__ == "__main__":
    main()
