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
    .venv/bin/python benchmarks/bench_per_example_check.py --quick     # 1 round
    python benchmarks/bench_per_example_check.py --device cuda --threads 8
"""

from __future__ import annotations

import argparse
import warnings

import torch

from bench_finetune import BATCH_SIZE, CLIP, NOISE, data_loader, sst2_batches
from timing import fed_by_hand, interleaved

LENGTH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds

    from dpnoise.models import minilm_sequence_classifier
    from dpnoise.training import make_private, verify_per_example_gradients
    from dpnoise.training.devices import to_device

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    device = torch.device(args.device)
    dataset, batches = sst2_batches(rounds + 1, LENGTH)
    batches = [to_device(batch, device, torch.float32) for batch in batches]
    model = minilm_sequence_classifier(2, "all")
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    module, private_optimizer, _ = make_private(model, optimizer, data_loader(dataset, LENGTH), mechanism="gaussian",
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
    print(f"MiniLM-L6, all {parameters:,} parameters trained, batch {BATCH_SIZE} x {LENGTH} tokens, {device}, "
          f"{args.threads} thread(s), {timings.rounds} rounds")
    print(f"dp-step {timings.median('dp-step'):.3f} s; check {timings.median('check'):.3f} s "
          f"= {timings.ratio('check', 'dp-step'):.2f}x the step")
    if report is not None:
        print(f"check: examples {report.examples}, largest relative errors: exactness {report.exactness.error:.2e}, "
              f"independence {report.independence.error:.2e}")


if __name__ == "__main__":
    main()
