"""Step time of book-keeping with the exact sources of transposed convolutions, PReLU, dpnoise's elementwise
layers and Hugging Face's ``ViTEmbeddings``, against the same layers re-run alone per example by ``torch.func``
(their source before they had one).

Three models, random weights and inputs, one torch thread, float32:

* ``decoder``: a DCGAN-like generator head, ``ConvTranspose2d`` 64 -> 32 -> 16 -> 3 channels from 8x8 to 64x64
  (stride 2, padding 1, kernel 4), each followed by a ``PReLU`` (one slope per channel), then a linear classifier;
* ``vit``: a ViT-like encoder from dpnoise.layers: patches (64 of 48 values) -> ``nn.Linear`` -> ``ClsToken`` ->
  ``PositionEmbedding``, 4 blocks ``x + Scale(mlp(x))`` (layer scale) with a ``Shift``, and a head on the CLS token;
* ``hf-vit``: Hugging Face's ``ViTForImageClassification`` with ViT-B's embeddings (224 px images in 16 px patches,
  hidden 768) and one encoder layer, without dropout (which the ``torch.func`` source refuses).  Its ``ViTEmbeddings``
  holds the CLS token and position embeddings as bare parameters: the captured source reads their per-example
  gradients off the gradient at the embeddings' dropout, the re-run repeats the patch convolution per example.

A step is the one-backward-pass DP step without noise: forward, backward, per-example L2 norms, clip factors,
clipped sums into ``p.grad``, SGD step.  Configurations: ``non-private`` (forward, backward, SGD step),
``exact source`` (the layers' rules, recorded and captured sources), ``torch.func`` (the same model with those layer
types' rules and captured sources unregistered and their recording switched off while it is wrapped, so
book-keeping re-runs each such layer per example).  Rounds interleave the configurations in a shuffled order (benchmarks/timing.py); ratios are medians
over rounds of ratios within a round.

    .venv/bin/python benchmarks/bench_layer_rules.py                # 5 rounds x 3 steps, every model
    .venv/bin/python benchmarks/bench_layer_rules.py --quick        # 1 round x 1 step
    .venv/bin/python benchmarks/bench_layer_rules.py --models vit --rounds 9
"""

from __future__ import annotations

import argparse
import copy
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.layers import ClsToken, PositionEmbedding, Scale, Shift
from dpnoise.mechanisms import clip_factors
from dpnoise.training import bookkeeping
from dpnoise.training.bookkeeping import BookkeepingModule, gradient_sources
from dpnoise.training.bookkeeping_rules import BOOKKEEPING_RULES
from dpnoise.training.captured_sources import CAPTURED_SOURCES
from timing import interleaved, same

#: the layer types whose exact source the benchmark switches off for the ``torch.func`` configuration
NEW_SOURCES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.PReLU, Scale, Shift, ClsToken, PositionEmbedding)
#: the same for the captured sources, by qualified class name
NEW_CAPTURED_SOURCES = ("transformers.models.vit.modeling_vit.ViTEmbeddings",)
BATCH_SIZE = 32
CLASSES = 10


class Decoder(nn.Sequential):
    def __init__(self):
        channels = [64, 32, 16, 3]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(channels, channels[1:]):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1), nn.PReLU(c_out)]
        super().__init__(*layers, nn.Flatten(), nn.Linear(3 * 64 * 64, CLASSES))


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.layer_scale = Scale(width, init=0.1)
        self.shift = Shift(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shift(x + self.layer_scale(self.mlp(self.norm(x))))


class Vit(nn.Module):
    def __init__(self, patches: int = 64, patch: int = 48, width: int = 192, depth: int = 4):
        super().__init__()
        self.patch = nn.Linear(patch, width)
        self.cls = ClsToken(width)
        self.positions = PositionEmbedding(patches + 1, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.positions(self.cls(self.patch(x))))[:, 0])


class HuggingFaceVit(nn.Module):
    """Hugging Face's ViT classifier with ViT-B's embeddings and one encoder layer, returning its logits."""

    def __init__(self):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(image_size=224, patch_size=16, hidden_size=768, intermediate_size=3072, num_hidden_layers=1,
                           num_attention_heads=12, num_labels=CLASSES, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation="eager")
        self.model = ViTForImageClassification(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "decoder": (Decoder, (64, 8, 8)),
    "vit": (Vit, (64, 48)),
    "hf-vit": (HuggingFaceVit, (3, 224, 224)),
}


@contextmanager
def per_layer_torch_func() -> Iterator[None]:
    """Within: :data:`NEW_SOURCES` and :data:`NEW_CAPTURED_SOURCES` have neither a rule nor a recorded or captured
    source, so a model wrapped here re-runs those layers per example by ``torch.func`` (the choice is made once,
    when it is wrapped)."""
    rules = {t: BOOKKEEPING_RULES.pop(t) for t in NEW_SOURCES if t in BOOKKEEPING_RULES}
    captured = {name: CAPTURED_SOURCES.pop(name) for name in NEW_CAPTURED_SOURCES if name in CAPTURED_SOURCES}
    recorded = bookkeeping.RECORDED_LAYERS
    bookkeeping.RECORDED_LAYERS = tuple(t for t in recorded if t not in NEW_SOURCES)
    try:
        yield
    finally:
        BOOKKEEPING_RULES.update(rules)
        CAPTURED_SOURCES.update(captured)
        bookkeeping.RECORDED_LAYERS = recorded


def private_step(wrapped: BookkeepingModule, model: nn.Module, optimizer: torch.optim.Optimizer,
                 x: torch.Tensor, y: torch.Tensor) -> None:
    """One DP step without noise: clipped per-example gradients (L2, clip at their median) summed into ``p.grad``."""
    optimizer.zero_grad()
    F.cross_entropy(wrapped(x), y).backward()
    norms = wrapped.per_example_norms(2)
    params = [p for p in model.parameters() if p.requires_grad]
    for p, summed in zip(params, wrapped.clipped_sums(params, clip_factors(norms, float(norms.median())))):
        p.grad = summed / len(x)
    optimizer.step()


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def candidates(name: str, steps: int) -> tuple[dict, dict[str, str]]:
    """The three configurations of ``name``'s model (each its own copy of the same weights) and the sources of the
    exact and torch.func configurations' layers."""
    build, shape = MODELS[name]
    torch.manual_seed(0)
    base = build()
    x, y = torch.randn(BATCH_SIZE, *shape), torch.randint(0, CLASSES, (BATCH_SIZE,))
    exact_model, func_model = copy.deepcopy(base), copy.deepcopy(base)
    exact = BookkeepingModule(exact_model)
    with per_layer_torch_func():
        func = BookkeepingModule(func_model)
        func_sources = gradient_sources(func_model, "bookkeeping")
    sources = {"exact source": summary(gradient_sources(exact_model, "bookkeeping")), "torch.func": summary(func_sources)}

    def repeated(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                step()
        return run

    sgd = {label: torch.optim.SGD(model.parameters(), lr=1e-3)
           for label, model in (("plain", base), ("exact", exact_model), ("func", func_model))}
    return {"non-private": same(repeated(lambda: plain_step(base, sgd["plain"], x, y))),
            "exact source": same(repeated(lambda: private_step(exact, exact_model, sgd["exact"], x, y))),
            "torch.func": same(repeated(lambda: private_step(func, func_model, sgd["func"], x, y)))}, sources


def summary(sources: dict[str, str]) -> str:
    """How many layers take each source, e.g. ``"book-keeping rule: 12, book-keeping, materialised: 3"``."""
    counts: dict[str, int] = {}
    for source in sources.values():
        counts[source] = counts.get(source, 0) + 1
    return ", ".join(f"{source}: {count}" for source, count in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=3, help="steps per configuration and round")
    parser.add_argument("--quick", action="store_true", help="1 round x 1 step")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 1
    torch.set_num_threads(1)
    for name in args.models:
        calls, sources = candidates(name, args.steps)
        timings = interleaved(calls, args.rounds, warmup=1)
        print(f"\n{name}, batch {BATCH_SIZE}, 1 thread, {timings.rounds} rounds x {args.steps} steps")
        for label, described in sources.items():
            print(f"  {label}: {described}")
        print(f"  {'configuration':<15}{'s/step':>9}{'x non-private':>15}{'x exact source':>16}")
        for label in calls:
            print(f"  {label:<15}{timings.median(label) / args.steps:>9.4f}{timings.ratio(label, 'non-private'):>14.2f}x"
                  f"{timings.ratio(label, 'exact source'):>15.2f}x")


if __name__ == "__main__":
    main()
