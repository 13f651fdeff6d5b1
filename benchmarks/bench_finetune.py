"""Private fine-tuning of MiniLM-L6 (22.7M parameters) on SST-2: dpnoise and Opacus against non-private.

Hugging Face's ``BertForSequenceClassification`` with the all-MiniLM-L6-v2 encoder
(:func:`dpnoise.models.minilm_sequence_classifier`), batches of 64 SST-2 training sentences padded
(or cut) to exactly ``L`` tokens, AdamW, one torch thread.  A step is zero_grad + forward + loss +
backward + optimizer.step: per-example clipping, noise and accounting included.  Configurations:

* ``non-private``: the plain AdamW step;
* ``gaussian``, ``lap2``, ``laplace-l1``: ``dpnoise.training.make_private`` as a user calls it (the
  batches as they come, no ``position_ids``), gradients by book-keeping;
* ``opacus-hooks``, ``opacus-ghost``: Opacus's ``PrivacyEngine.make_private`` with
  ``grad_sample_mode="hooks"`` / ``"ghost"`` (Gaussian DP-SGD; the position ids passed explicitly
  and contiguous, which Opacus needs with this model).

Each configuration runs in its own process (so that its peak memory, the process's peak resident
set, is its own): warm-up steps, then timed steps on the same pre-drawn batches as every other
configuration.  Processes are started in a freshly shuffled order in every round
(benchmarks/timing.py); a figure is the median over rounds, a ratio the median over rounds of the
ratio within the round.  A configuration that fails (e.g. out of memory) is reported with its error.

    .venv/bin/python benchmarks/bench_finetune.py            # L = 32 and 128, all parameters and LoRA, 3 rounds x 2 steps
    .venv/bin/python benchmarks/bench_finetune.py --quick    # L = 32, all parameters, 1 round x 1 step
    .venv/bin/python benchmarks/bench_finetune.py --lengths 32 --trainable all --rounds 5
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable

from timing import add_process_options, fed_by_hand, interleaved, own_processes, print_process_table, timed_steps

BATCH_SIZE = 64
DP_MECHANISMS = ("gaussian", "lap2", "laplace-l1")
CONFIGURATIONS = ("non-private", *DP_MECHANISMS, "opacus-hooks", "opacus-ghost")
#: noise of every private configuration, in its mechanism's unit (it does not change the step time)
NOISE = 1.0
CLIP = 0.1

Step = Callable[[dict], None]


def sst2_batches(steps: int, length: int) -> tuple[object, list[dict]]:
    """The SST-2 training set and ``steps`` batches of ``BATCH_SIZE`` sentences padded or cut to
    exactly ``length`` tokens (seeded: every process draws the same batches)."""
    import torch

    from dpnoise.data import load_dataset, minilm_tokenizer

    dataset = load_dataset("sst2", "train")
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[: steps * BATCH_SIZE]
    batches = []
    for indices in chosen.view(steps, BATCH_SIZE).tolist():
        encoded = minilm_tokenizer()([dataset.sentences[i] for i in indices], padding="max_length",
                                     truncation=True, max_length=length, return_tensors="pt")
        batches.append({**encoded, "labels": torch.as_tensor([int(dataset.labels[i]) for i in indices])})
    return dataset, batches


def data_loader(dataset: object, length: int):
    """A loader over the training set for the engines' sample rate (the timed steps use the pre-drawn batches)."""
    from torch.utils.data import DataLoader

    from dpnoise.data import TokenizedText, tokenize_for_classifier

    return DataLoader(tokenize_for_classifier(dataset, max_length=length), batch_size=BATCH_SIZE,
                      collate_fn=TokenizedText.collate)


def non_private_step(model, optimizer, loader) -> Step:
    def step(batch: dict) -> None:
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()

    return step


def dpnoise_step(mechanism: str) -> Callable[..., Step]:
    def build(model, optimizer, loader) -> Step:
        from dpnoise.accounting import noise_keywords
        from dpnoise.training import make_private

        module, private_optimizer, _ = make_private(model, optimizer, loader, mechanism=mechanism,
                                                    **noise_keywords(mechanism, NOISE), max_grad_norm=CLIP,
                                                    delta=1e-5)
        return non_private_step(module, fed_by_hand(private_optimizer), loader)

    return build


def opacus_step(grad_sample_mode: str) -> Callable[..., Step]:
    def build(model, optimizer, loader) -> Step:
        import torch
        from opacus import PrivacyEngine

        criterion = torch.nn.CrossEntropyLoss()
        module, private_optimizer, *wrapped = PrivacyEngine(accountant="rdp").make_private(
            module=model, optimizer=optimizer, data_loader=loader, criterion=criterion,
            noise_multiplier=NOISE, max_grad_norm=CLIP, grad_sample_mode=grad_sample_mode, poisson_sampling=True,
        )
        if grad_sample_mode == "ghost":  # ghost clipping wraps the criterion too (its two backward passes)
            criterion = wrapped[0]

        def step(batch: dict) -> None:
            inputs = {key: value for key, value in batch.items() if key != "labels"}
            length = batch["input_ids"].shape[1]
            positions = torch.arange(length).expand(len(batch["input_ids"]), length).contiguous()
            private_optimizer.zero_grad()
            criterion(module(**inputs, position_ids=positions).logits, batch["labels"]).backward()
            private_optimizer.step()

        return step

    return build


STEP_BUILDERS = {
    "non-private": non_private_step,
    **{mechanism: dpnoise_step(mechanism) for mechanism in DP_MECHANISMS},
    "opacus-hooks": opacus_step("hooks"),
    "opacus-ghost": opacus_step("ghost"),
}


def measure(configuration: str, length: int, trainable: str, steps: int, warmup: int) -> dict:
    """Run in a child process: ``warmup`` then ``steps`` steps of ``configuration``
    (:func:`timing.timed_steps`), and the number of trained parameters."""
    import torch

    from dpnoise.models import minilm_sequence_classifier

    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    dataset, batches = sst2_batches(warmup + steps, length)
    model = minilm_sequence_classifier(2, trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    step = STEP_BUILDERS[configuration](model, optimizer, data_loader(dataset, length))
    return {**timed_steps(step, batches, warmup),
            "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128], help="tokens per sentence")
    parser.add_argument("--trainable", nargs="+", choices=("all", "lora"), default=["all", "lora"],
                        help="every parameter, or LoRA adapters (rank 8, query and value) and the head")
    add_process_options(parser, CONFIGURATIONS, quick="L = 32, every parameter, 1 round x 1 step")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.lengths[0], args.trainable[0], args.steps, args.warmup)))
        return
    if args.quick:
        args.lengths, args.trainable, args.rounds, args.steps = [32], ["all"], 1, 1
    configurations = ["non-private", *(c for c in args.configurations if c != "non-private")]
    for trainable in args.trainable:
        for length in args.lengths:
            candidates = own_processes(__file__, configurations, lambda name: [
                "--measure", name, "--lengths", str(length), "--trainable", trainable, "--steps", str(args.steps),
                "--warmup", str(args.warmup)])
            timings = interleaved(candidates, args.rounds)
            print(f"\nL = {length} tokens, trainable {trainable} "
                  f"({timings.values['non-private'].get('parameters', 0):,} parameters), batch {BATCH_SIZE}, "
                  f"1 thread, {timings.rounds} rounds")
            print_process_table(configurations, timings)


if __name__ == "__main__":
    main()
