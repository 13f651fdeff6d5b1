"""Private fine-tuning of transformers, from MiniLM-L6 (22.7M parameters) to 10^8 parameters: dpnoise and Opacus
against non-private, speed and peak memory.

Models (``--models``):

* ``minilm`` (the default): Hugging Face's ``BertForSequenceClassification`` with the all-MiniLM-L6-v2 encoder
  (:func:`dpnoise.models.minilm_sequence_classifier`), SST-2 training sentences padded (or cut) to exactly ``L``
  tokens; every parameter, or LoRA adapters (``--trainable``);
* built from their configs with random weights and random inputs (no weights are installed; the step's cost does
  not depend on them), every parameter trained: ``roberta-base`` (``RobertaForSequenceClassification``, 125M),
  ``gpt2`` (``GPT2LMHeadModel``, GPT-2 small, 124M, trained on each sequence's own mean next-token loss,
  :func:`dpnoise.training.causal_lm_loss`), ``vit-b16`` (``ViTForImageClassification``, ViT-B/16, 86M, images
  of ``--image-size`` px) and ``llama`` (the small ``LlamaForSequenceClassification`` of
  bench_layer_sources.py, RMSNorm, 10.2M); the text models on sequences of ``L`` tokens, all real.

AdamW, one torch thread.  A step is zero_grad + forward + loss + backward + optimizer.step: per-example clipping,
noise and accounting included.  Configurations:

* ``non-private``: the plain AdamW step;
* ``gaussian``, ``lap2``, ``laplace-l1``: ``dpnoise.training.make_private`` as a user calls it (the batches as
  they come, no ``position_ids``), each layer's per-example gradients from its cheapest exact source
  (``engine.gradient_sources``, printed as counts per source).  Before the timing, in a process of its own, the
  update of each is checked: the per-example gradients its clipping reads, for 3 examples of a 4-example batch,
  against one-example autograd in float64 (:func:`dpnoise.training.verify_per_example_gradients`); the largest
  relative error is printed, and one above 1e-4 fails the benchmark (exit status 1).  The timed processes skip
  ``make_private``'s own first-step check (``per_example_check=False``), which is that same check;
* ``opacus-hooks``, ``opacus-ghost``: Opacus's ``PrivacyEngine.make_private`` with ``grad_sample_mode="hooks"``
  / ``"ghost"`` (Gaussian DP-SGD; the position ids passed explicitly and contiguous where the model has learned
  ones, which Opacus needs; GPT-2's loss per sequence as Opacus's ghost clipping computes it).

Each configuration runs in its own process: build, then warm-up steps and timed steps on the same pre-drawn
batches as every other configuration.  Its peak memory is the process's peak resident set during the steps
(model, optimizer state, data and Python included; the peak is reset once the model and optimizer are built).
Processes are started in a freshly shuffled order in every round (benchmarks/timing.py); a figure is the median
over rounds, a ratio the median over rounds of the ratio within the round (time) or the ratio of the last
round's peaks (memory).  Each row also shows the mean seconds of the step's phases: forward (with the loss),
backward, and optimizer.step (clipping, noise, the update).  A configuration that fails (e.g. out of memory) is
reported with its error.

    .venv/bin/python benchmarks/bench_finetune.py            # MiniLM, L = 32 and 128, all parameters and LoRA, 3 rounds x 2 steps
    .venv/bin/python benchmarks/bench_finetune.py --quick    # MiniLM, L = 32, all parameters, 1 round x 1 step
    .venv/bin/python benchmarks/bench_finetune.py --lengths 32 --trainable all --rounds 5
    .venv/bin/python benchmarks/bench_finetune.py --models roberta-base gpt2 vit-b16 llama --lengths 128 \\
        --batch-size 8 --rounds 2 --steps 1 --configurations non-private gaussian lap2 laplace-l1 opacus-ghost
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from bench_layer_sources import build_model as small_model
from bench_layer_sources import LLAMA_VOCABULARY, data_loader as examples_loader
from bench_layer_sources import random_image_batches, random_token_batches, source_counts
from timing import (add_process_options, fed_by_hand, in_own_process, interleaved, own_processes,
                    print_process_table, reset_peak_memory, timed_steps)

BATCH_SIZE = 64
DP_MECHANISMS = ("gaussian", "lap2", "laplace-l1")
CONFIGURATIONS = ("non-private", *DP_MECHANISMS, "opacus-hooks", "opacus-ghost")
MODELS = ("minilm", "roberta-base", "gpt2", "vit-b16", "llama")
#: noise of every private configuration, in its mechanism's unit (it does not change the step time)
NOISE = 1.0
CLIP = 0.1
#: the update check: examples compared with one-example autograd (in a batch of one more), and the largest
#: relative error that passes
CHECKED_EXAMPLES = 3
CHECK_RTOL = 1e-4
PHASES = ("forward", "backward", "step")

#: a step: one batch in, the seconds of each of its :data:`PHASES` out
Step = Callable[[dict], dict]


@dataclass(frozen=True)
class Workload:
    """A model to train, its pre-drawn batches, a loader over its data set (for the engines' sample rate) and its
    training loss."""

    model: object
    batches: list[dict]
    loader: object
    #: ``loss_fn(logits, labels)``, the mean over the batch (None: the model's own ``outputs.loss``)
    loss_fn: Optional[Callable] = None
    #: the first position id of the model's learned position embeddings, which Opacus is given explicitly
    #: (None: no learned position embeddings)
    position_offset: Optional[int] = None


def sst2_batches(steps: int, length: int, batch_size: int = BATCH_SIZE) -> tuple[object, list[dict]]:
    """The SST-2 training set and ``steps`` batches of ``batch_size`` sentences padded or cut to
    exactly ``length`` tokens (seeded: every process draws the same batches)."""
    import torch

    from dpnoise.data import load_dataset, minilm_tokenizer

    dataset = load_dataset("sst2", "train")
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[: steps * batch_size]
    batches = []
    for indices in chosen.view(steps, batch_size).tolist():
        encoded = minilm_tokenizer()([dataset.sentences[i] for i in indices], padding="max_length",
                                     truncation=True, max_length=length, return_tensors="pt")
        batches.append({**encoded, "labels": torch.as_tensor([int(dataset.labels[i]) for i in indices])})
    return dataset, batches


def data_loader(dataset: object, length: int, batch_size: int = BATCH_SIZE):
    """A loader over the training set for the engines' sample rate (the timed steps use the pre-drawn batches)."""
    from torch.utils.data import DataLoader

    from dpnoise.data import TokenizedText, tokenize_for_classifier

    return DataLoader(tokenize_for_classifier(dataset, max_length=length), batch_size=batch_size,
                      collate_fn=TokenizedText.collate)


def random_weights_model(name: str, image_size: int):
    """``name``'s model (not ``minilm``) built from its config with random weights, 2 classes."""
    from transformers import (GPT2Config, GPT2LMHeadModel, RobertaConfig, RobertaForSequenceClassification,
                              ViTConfig, ViTForImageClassification)

    if name == "roberta-base":  # roberta-base's config.json
        return RobertaForSequenceClassification(RobertaConfig(
            vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
            bos_token_id=0, eos_token_id=2, num_labels=2))
    if name == "gpt2":
        return GPT2LMHeadModel(GPT2Config())
    if name == "vit-b16":
        return ViTForImageClassification(ViTConfig(image_size=image_size, patch_size=16, num_labels=2))
    return small_model(name)


def workload(name: str, trainable: str, length: int, image_size: int, batch_size: int, count: int) -> Workload:
    """``name``'s model (in training mode), ``count`` batches of ``batch_size`` examples, its loader and loss."""
    from dpnoise.training import causal_lm_loss

    if name == "minilm":
        from dpnoise.models import minilm_sequence_classifier

        dataset, batches = sst2_batches(count, length, batch_size)
        return Workload(minilm_sequence_classifier(2, trainable), batches, data_loader(dataset, length, batch_size),
                        position_offset=0)
    model = random_weights_model(name, image_size).train()
    if name == "vit-b16":
        batches = random_image_batches(count, batch_size, image_size)
    else:
        vocabulary = LLAMA_VOCABULARY if name == "llama" else model.config.vocab_size
        batches = random_token_batches(count, batch_size, length, vocabulary, None if name == "gpt2" else 2)
    if name == "gpt2":
        return Workload(model, batches, examples_loader(batches), causal_lm_loss, position_offset=0)
    offset = model.config.pad_token_id + 1 if name == "roberta-base" else None  # RoBERTa's positions follow padding's
    return Workload(model, batches, examples_loader(batches), position_offset=offset)


def training_loss(module, batch: dict, loss_fn: Optional[Callable]):
    """The batch's training loss: ``loss_fn`` of the logits, or the model's own ``outputs.loss``."""
    if loss_fn is None:
        return module(**batch).loss
    return loss_fn(module(**{key: value for key, value in batch.items() if key != "labels"}).logits, batch["labels"])


def phased_step(optimizer, loss: Callable[[dict], object]) -> Step:
    """zero_grad, then ``loss(batch)`` (forward), its backward pass and ``optimizer.step()``, each phase timed."""
    def step(batch: dict) -> dict:
        optimizer.zero_grad()
        marks = [time.perf_counter()]
        value = loss(batch)
        marks.append(time.perf_counter())
        value.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        return {phase: end - start for phase, start, end in zip(PHASES, marks, marks[1:])}

    return step


def non_private_step(work: Workload, optimizer) -> tuple[Step, dict]:
    return phased_step(optimizer, lambda batch: training_loss(work.model, batch, work.loss_fn)), {}


def private_model(mechanism: str, work: Workload, optimizer) -> tuple[object, object]:
    """``make_private`` on ``work`` with ``mechanism`` (without its first-step check: see the module docstring)."""
    from dpnoise.accounting import noise_keywords
    from dpnoise.training import make_private

    module, private_optimizer, _ = make_private(work.model, optimizer, work.loader, mechanism=mechanism,
                                                **noise_keywords(mechanism, NOISE), max_grad_norm=CLIP, delta=1e-5,
                                                loss_fn=work.loss_fn, per_example_check=False)
    return module, private_optimizer


def dpnoise_step(mechanism: str) -> Callable[..., tuple[Step, dict]]:
    def build(work: Workload, optimizer) -> tuple[Step, dict]:
        module, private_optimizer = private_model(mechanism, work, optimizer)
        step = phased_step(fed_by_hand(private_optimizer), lambda batch: training_loss(module, batch, work.loss_fn))
        return step, {"sources": source_counts(private_optimizer)}

    return build


def checked_update(mechanism: str, work: Workload, optimizer) -> dict:
    """Run in a child process: the per-example gradients ``mechanism``'s engine clips, of
    :data:`CHECKED_EXAMPLES` examples of the first batch's first ``CHECKED_EXAMPLES + 1``, against one-example
    autograd: the largest relative errors, or the failure; the per-layer gradient sources."""
    from dpnoise.training import verify_per_example_gradients
    from dpnoise.training.errors import PerExampleCheckError

    module, private_optimizer = private_model(mechanism, work, optimizer)
    started = time.perf_counter()
    try:
        report = verify_per_example_gradients(module, work.batches[0], loss_fn=work.loss_fn,
                                              examples=CHECKED_EXAMPLES, rtol=CHECK_RTOL,
                                              batch_limit=CHECKED_EXAMPLES + 1)
        check = {"exactness": report.exactness.error, "independence": report.independence.error}
    except PerExampleCheckError as err:
        check = {"failed": str(err)}
    return {"seconds": time.perf_counter() - started, "sources": source_counts(private_optimizer), "check": check}


def opacus_step(grad_sample_mode: str) -> Callable[..., tuple[Step, dict]]:
    def build(work: Workload, optimizer) -> tuple[Step, dict]:
        import torch
        from opacus import PrivacyEngine


        criterion = torch.nn.CrossEntropyLoss()
        module, private_optimizer, *wrapped = PrivacyEngine(accountant="rdp").make_private(
            module=work.model, optimizer=optimizer, data_loader=work.loader, criterion=criterion,
            noise_multiplier=NOISE, max_grad_norm=CLIP, grad_sample_mode=grad_sample_mode, poisson_sampling=True,
        )
        if grad_sample_mode == "ghost":  # ghost clipping wraps the criterion too (its two backward passes)
            criterion = wrapped[0]

        def loss(batch: dict):
            inputs = {key: value for key, value in batch.items() if key != "labels"}
            if work.position_offset is not None:
                batch_size, length = batch["input_ids"].shape
                inputs["position_ids"] = (torch.arange(length) + work.position_offset).expand(batch_size,
                                                                                            length).contiguous()
            logits, labels = module(**inputs).logits, batch["labels"]
            if work.loss_fn is None:
                return criterion(logits, labels)
            if grad_sample_mode != "ghost":  # the hooks: the loss as dpnoise's rows take it
                return work.loss_fn(logits, labels)
            # ghost clipping: Opacus's per-sequence mean of the next-token losses (its "generative NLP" path)
            shifted = logits[:, :-1]
            return criterion(shifted.flatten(0, 1), labels[:, 1:].flatten(), shape=shifted.shape)

        return phased_step(private_optimizer, loss), {}

    return build


STEP_BUILDERS = {
    "non-private": non_private_step,
    **{mechanism: dpnoise_step(mechanism) for mechanism in DP_MECHANISMS},
    "opacus-hooks": opacus_step("hooks"),
    "opacus-ghost": opacus_step("ghost"),
}


def measure(configuration: str, name: str, trainable: str, length: int, image_size: int, batch_size: int,
            steps: int, warmup: int, check: bool) -> dict:
    """Run in a child process: with ``check``, :func:`checked_update` of the dpnoise ``configuration``; otherwise
    build ``configuration`` on ``name``'s workload, then ``warmup`` and ``steps`` steps (:func:`timing.timed_steps`,
    the peak memory of the steps): the step's figures with the mean seconds of each phase over the timed steps,
    the number of trained parameters and the dpnoise rows' per-layer sources."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    work = workload(name, trainable, length, image_size, batch_size, warmup + steps)
    optimizer = torch.optim.AdamW([p for p in work.model.parameters() if p.requires_grad], lr=5e-4)
    if check:
        return checked_update(configuration, work, optimizer)
    step, report = STEP_BUILDERS[configuration](work, optimizer)
    phases: list[dict] = []
    reset_peak_memory()
    figures = timed_steps(lambda batch: phases.append(step(batch)), work.batches, warmup)
    timed = phases[warmup:]
    return {**figures, **report, "phases": {phase: sum(p[phase] for p in timed) / len(timed) for phase in PHASES},
            "parameters": sum(p.numel() for p in work.model.parameters() if p.requires_grad)}


def run_check(configuration: str, arguments: list[str]) -> bool:
    """Check the dpnoise ``configuration``'s update in a process of its own (``arguments``: the child's) and print
    its per-layer gradient sources (layers per source) and the check's verdict; whether the check passed."""
    value = in_own_process(__file__, [*arguments, "--check"]).value
    if "error" in value:
        print(f"  {configuration:<12} update check: FAILED, the process failed: {value['error'][:300]}", flush=True)
        return False
    check = value["check"]
    passed = "failed" not in check
    verdict = (f"largest relative error {check['exactness']:.2e} (independence {check['independence']:.2e}), "
               f"pass (<= {CHECK_RTOL:g})" if passed else f"FAILED (> {CHECK_RTOL:g}): {check['failed'][:300]}")
    sources = ", ".join(f"{source}: {count}" for source, count in sorted(value["sources"].items()))
    print(f"  {configuration:<12} sources (layers): {sources}\n  {'':<12} update check: {verdict}", flush=True)
    return passed


def print_phases(configurations: list[str], values: dict) -> None:
    """Mean seconds of each phase of the last round's timed steps, per configuration."""
    print(f"{'phases (s)':<15}" + "".join(f"{phase:>10}" for phase in PHASES))
    for configuration in (c for c in configurations if "phases" in values[c]):
        print(f"{configuration:<15}" + "".join(f"{values[configuration]['phases'][p]:>10.2f}" for p in PHASES))


def parse_arguments(arguments: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["minilm"],
                        help="models to benchmark, one table each (default: minilm)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128],
                        help="tokens per sequence of the text models (default: 32 128)")
    parser.add_argument("--image-size", type=int, default=224, help="ViT-B/16's image side in px (default 224)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"examples per step (default {BATCH_SIZE})")
    parser.add_argument("--trainable", nargs="+", choices=("all", "lora"), default=["all", "lora"],
                        help="every parameter, or LoRA adapters (rank 8, query and value) and the head; LoRA is "
                             "MiniLM's only (the other models train every parameter)")
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    add_process_options(parser, CONFIGURATIONS, quick="MiniLM, L = 32, every parameter, 1 round x 1 step")
    return parser.parse_args(arguments)


def main() -> None:
    args = parse_arguments()
    if args.measure:
        print(json.dumps(measure(args.measure, args.models[0], args.trainable[0], args.lengths[0], args.image_size,
                                 args.batch_size, args.steps, args.warmup, args.check)))
        return
    if args.quick:
        args.models, args.lengths, args.trainable, args.rounds, args.steps = ["minilm"], [32], ["all"], 1, 1
    configurations = ["non-private", *(c for c in args.configurations if c != "non-private")]
    passed = True
    for name in args.models:
        for trainable in args.trainable if name == "minilm" else ["all"]:
            for length in args.lengths if name != "vit-b16" else [0]:
                def child(configuration: str) -> list[str]:
                    return ["--measure", configuration, "--models", name, "--trainable", trainable,
                            "--lengths", str(length or args.lengths[0]), "--image-size", str(args.image_size),
                            "--batch-size", str(args.batch_size), "--steps", str(args.steps),
                            "--warmup", str(args.warmup)]

                shape = f"L = {length} tokens" if length else f"{args.image_size} px images"
                print(f"\n{name}, {shape}, trainable {trainable}, batch {args.batch_size}, 1 thread", flush=True)
                for configuration in (c for c in configurations if c in DP_MECHANISMS):
                    passed &= run_check(configuration, child(configuration))
                timings = interleaved(own_processes(__file__, configurations, child), args.rounds)
                print(f"{timings.values['non-private'].get('parameters', 0):,} parameters trained, "
                      f"{timings.rounds} rounds x {args.steps} steps")
                print_process_table(configurations, timings)
                print_phases(configurations, timings.values)
                sys.stdout.flush()
    if not passed:
        print(f"\nFAILED: an update check found a relative error above {CHECK_RTOL:g}, or did not run")
        sys.exit(1)


if __name__ == "__main__":
    main()
