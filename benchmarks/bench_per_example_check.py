"""Cost of make_private's per-example check against one private step, on MiniLM-L6 fully fine-tuned.

``BertForSequenceClassification`` with the all-MiniLM-L6-v2 encoder (22.7M parameters, every one
trained), batches of 64 SST-2 training sentences padded (or cut) to 32 tokens, AdamW, Gaussian noise,
book-keeping.  In one process, interleaved rounds on the same pre-drawn batches:

* ``dp-step``: zero_grad + forward + loss + backward + ``optimizer.step()`` (clipping, noise, accounting);
* ``check``: :func:`dpnoise.training.verify_per_example_gradients` on the same private model and batch, as
  the first step runs it (3 examples against one-example autograd, one of the others replaced; in float64,
  dropout off): what the first step costs on top of a step.

A figure is the median over rounds; the ratio is the median over rounds of check / dp-step within a round.

    .venv/bin/python benchmarks/bench_per_example_check.py             # 5 rounds, one thread
    .venv/bin/python benchmarks/bench_per_example_check.py --quick     # 1 round (make bench)
    python benchmarks/bench_per_example_check.py --random --device cuda --threads 8

``--random``: MiniLM-L6's architecture with random weights and random token ids (the cost does not depend on
them), where the pretrained weights and SST-2 are not installed.
"""

from __future__ import annotations

import argparse
import warnings

import torch

from bench_finetune import BATCH_SIZE, CLIP, NOISE, data_loader, sst2_batches
from timing import fed_by_hand, interleaved

LENGTH = 32


def random_minilm(steps: int):
    """MiniLM-L6's architecture (BERT, 6 layers of width 384) with random weights, ``steps`` batches of random
    token ids and a loader over more of them (for the engine's sample rate)."""
    from torch.utils.data import DataLoader
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, num_labels=2)
    ids = torch.randint(1000, 30000, (steps * BATCH_SIZE + 1000, LENGTH))
    labels = torch.randint(0, 2, (len(ids),))
    examples = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y} for i, y in zip(ids, labels)]
    batches = [torch.utils.data.default_collate(examples[k * BATCH_SIZE:(k + 1) * BATCH_SIZE]) for k in range(steps)]
    return BertForSequenceClassification(config).train(), batches, DataLoader(examples, batch_size=BATCH_SIZE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--random", action="store_true",
                        help="MiniLM-L6's architecture with random weights, on random token ids")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds

    from dpnoise.models import minilm_sequence_classifier
    from dpnoise.training import make_private, verify_per_example_gradients
    from dpnoise.training.devices import to_device

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    device = torch.device(args.device)
    if args.random:
        model, batches, loader = random_minilm(rounds + 1)
    else:
        dataset, batches = sst2_batches(rounds + 1, LENGTH)
        model, loader = minilm_sequence_classifier(2, "all"), data_loader(dataset, LENGTH)
    batches = [to_device(batch, device, torch.float32) for batch in batches]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    module, private_optimizer, _ = make_private(model, optimizer, loader, mechanism="gaussian",
                                                noise_multiplier=NOISE, max_grad_norm=CLIP, delta=1e-5, device=device)
    fed_by_hand(private_optimizer)

    def synchronised(call):
        def timed():
            value = call()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return value
        return timed

    def dp_step(i: int):
        def call() -> None:
            private_optimizer.zero_grad()
            module(**batches[i + 1]).loss.backward()
            private_optimizer.step()
        return synchronised(call)

    def check(i: int):
        return synchronised(lambda: verify_per_example_gradients(module, batches[i + 1]))

    timings = interleaved({"dp-step": dp_step, "check": check}, rounds, warmup=1)
    report = timings.values["check"]
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = "random weights" if args.random else "pretrained"
    print(f"MiniLM-L6 ({weights}), all {parameters:,} parameters trained, batch {BATCH_SIZE} x {LENGTH} tokens, {device}, "
          f"{args.threads} thread(s), {timings.rounds} rounds")
    print(f"dp-step {timings.median('dp-step'):.3f} s; check {timings.median('check'):.3f} s "
          f"= {timings.ratio('check', 'dp-step'):.2f}x the step")
    if report is not None:
        print(f"check: examples {report.examples}, largest relative errors: exactness {report.exactness.error:.2e}, "
              f"independence {report.independence.error:.2e}")


if __name__ == "__main__":
    main()
