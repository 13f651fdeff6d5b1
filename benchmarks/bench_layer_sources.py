"""DP step time of models with layers that have no book-keeping rule: Llama (RMSNorm) and ViT (CLS token and
position embeddings), each layer from its cheapest exact source, against the whole model on Opacus's hooks.

Hugging Face's ``LlamaForSequenceClassification`` and ``ViTForImageClassification`` built from small configs
with random weights (the step's cost does not depend on them), random token ids / images and labels, AdamW, one
torch thread.  Configurations:

* ``non-private``: the plain AdamW step;
* ``gaussian``: ``make_private`` as a user calls it (``grad_sample_mode="auto"``): book-keeping, the layers
  without a rule re-run alone per example by ``torch.func``;
* ``gaussian-hooks``: the same with ``grad_sample_mode="hooks"`` (every layer's per-example gradients
  materialised), what ``auto`` chose for these models before the per-layer source;
* ``opacus-ghost``: Opacus 1.6's ``PrivacyEngine.make_private(grad_sample_mode="ghost")``.

Each configuration runs in its own process (its peak memory is its own), in a shuffled order every round
(benchmarks/timing.py); ratios are medians over rounds of ratios within a round.  Each child first prints the
per-layer gradient sources of the dpnoise configurations.

    .venv/bin/python benchmarks/bench_layer_sources.py                 # both models, 3 rounds x 2 steps
    .venv/bin/python benchmarks/bench_layer_sources.py --quick         # 1 round x 1 step
    .venv/bin/python benchmarks/bench_layer_sources.py --models llama --rounds 5
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import Counter

from timing import add_process_options, fed_by_hand, interleaved, own_processes, print_process_table, timed_steps

BATCH_SIZE = 16
SEQUENCE_LENGTH = 128
IMAGE_SIZE = 64
CONFIGURATIONS = ("non-private", "gaussian", "gaussian-hooks", "opacus-ghost")
MODELS = ("llama", "vit")
NOISE, CLIP = 1.0, 0.1
LLAMA_VOCABULARY = 8000


def build_model(name: str):
    """A small random-weight Llama or ViT classifier (2 classes)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification, ViTConfig, ViTForImageClassification

    if name == "llama":
        config = LlamaConfig(vocab_size=LLAMA_VOCABULARY, hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
                             num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=SEQUENCE_LENGTH,
                             num_labels=2, pad_token_id=0, attn_implementation="eager")
        return LlamaForSequenceClassification(config)
    config = ViTConfig(image_size=IMAGE_SIZE, patch_size=8, hidden_size=384, intermediate_size=1024,
                       num_hidden_layers=4, num_attention_heads=6, num_labels=2, attn_implementation="eager")
    return ViTForImageClassification(config)


def random_token_batches(count: int, batch_size: int, length: int, vocab_size: int,
                         classes: int | None = 2) -> list[dict]:
    """``count`` seeded batches of ``batch_size`` random sequences of ``length`` token ids (1 to ``vocab_size`` - 1,
    every token real) with ``classes`` random labels, or (``classes`` None) the tokens as labels (causal LM)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
        labels = ids.clone() if classes is None else torch.randint(0, classes, (batch_size,), generator=generator)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return batches


def random_image_batches(count: int, batch_size: int, image_size: int, classes: int = 2) -> list[dict]:
    """``count`` seeded batches of ``batch_size`` random RGB images of ``image_size`` px with random labels."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return [{"pixel_values": torch.randn(batch_size, 3, image_size, image_size, generator=generator),
             "labels": torch.randint(0, classes, (batch_size,), generator=generator)} for _ in range(count)]


def random_batches(name: str, count: int) -> list[dict]:
    """``count`` seeded batches of ``BATCH_SIZE`` examples for ``name``'s model."""
    if name == "llama":
        return random_token_batches(count, BATCH_SIZE, SEQUENCE_LENGTH, LLAMA_VOCABULARY)
    return random_image_batches(count, BATCH_SIZE, IMAGE_SIZE)


def data_loader(batches: list[dict]):
    """A loader over the examples of ``batches``, in batches of their size (the engines read its size and sample
    rate)."""
    from torch.utils.data import DataLoader

    size = len(batches[0]["labels"])
    examples = [{key: value[i] for key, value in batch.items()} for batch in batches for i in range(size)]
    return DataLoader(examples, batch_size=size)


def source_counts(private_optimizer) -> dict[str, int]:
    """How many trainable layers take their per-example gradients from each source
    (``engine.gradient_sources`` of a dpnoise private optimizer's engine)."""
    return dict(Counter(private_optimizer.privacy_engine.gradient_sources.values()))


def measure(configuration: str, name: str, steps: int, warmup: int) -> dict:
    """Run in a child process: ``warmup`` then ``steps`` steps of ``configuration`` on ``name``."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    batches = random_batches(name, warmup + steps)
    model = build_model(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = data_loader(batches)
    sources = {}
    if configuration == "non-private":
        module, step_optimizer = model, optimizer
    elif configuration == "opacus-ghost":
        return {**opacus_ghost_steps(model, optimizer, loader, batches, warmup), "parameters": _count(model)}
    else:
        from dpnoise.training import make_private

        mode = "hooks" if configuration == "gaussian-hooks" else "auto"
        module, private, _ = make_private(model, optimizer, loader, mechanism="gaussian", noise_multiplier=NOISE,
                                          max_grad_norm=CLIP, delta=1e-5, grad_sample_mode=mode)
        step_optimizer = fed_by_hand(private)
        sources = source_counts(private)

    def step(batch: dict) -> None:
        step_optimizer.zero_grad()
        module(**batch).loss.backward()
        step_optimizer.step()

    return {**timed_steps(step, batches, warmup), "parameters": _count(model), "sources": sources}


def opacus_ghost_steps(model, optimizer, loader, batches: list[dict], warmup: int) -> dict:
    import torch
    from opacus import PrivacyEngine

    criterion = torch.nn.CrossEntropyLoss()
    module, private, criterion, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=optimizer, data_loader=loader, criterion=criterion, noise_multiplier=NOISE,
        max_grad_norm=CLIP, grad_sample_mode="ghost", poisson_sampling=True)

    def step(batch: dict) -> None:
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        private.zero_grad()
        criterion(module(**inputs).logits, batch["labels"]).backward()
        private.step()

    return timed_steps(step, batches, warmup)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    add_process_options(parser, CONFIGURATIONS, quick="1 round x 1 step")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.models[0], args.steps, args.warmup)))
        return
    if args.quick:
        args.rounds, args.steps = 1, 1
    configurations = ["non-private", *(c for c in args.configurations if c != "non-private")]
    for name in args.models:
        candidates = own_processes(__file__, configurations, lambda configuration: [
            "--measure", configuration, "--models", name, "--steps", str(args.steps), "--warmup", str(args.warmup)])
        timings = interleaved(candidates, args.rounds)
        shape = f"{SEQUENCE_LENGTH} tokens" if name == "llama" else f"{IMAGE_SIZE} px images"
        print(f"\n{name} ({timings.values['non-private'].get('parameters', 0):,} parameters), batch {BATCH_SIZE}, "
              f"{shape}, 1 thread, {timings.rounds} rounds")
        for configuration in ("gaussian", "gaussian-hooks"):
            if configuration in configurations:
                print(f"  {configuration} sources: {timings.values[configuration].get('sources')}")
        print_process_table(configurations, timings)


if __name__ == "__main__":
    main()
