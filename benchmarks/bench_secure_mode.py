"""Step time of secure mode (``make_private(secure_mode=True)``) against the default mode, in ONE run.

For each gradient mechanism (gaussian, lap2, laplace-l1) the same model is made private twice, by
default (clipped sum + float noise from torch's generator) and in secure mode (the sum rounded onto
the plan's grid + exact integer noise from os.urandom, computed on the CPU), and both are timed on
the same pre-drawn batches, interleaved step by step in shuffled order (benchmarks/timing.py); the
figure is the median over rounds of the paired ratio secure / default.  A "step" is zero_grad +
forward + loss + backward + optimizer.step (clipping, noise and accounting included).

* ``--model cnn`` (default): the TensorFlow Privacy tutorial CNN (26,010 parameters), Fashion-MNIST,
  batch 256, as benchmarks/bench_training.py.
* ``--model minilm``: MiniLM-L6 full fine-tuning (22.7M parameters, ``--trainable all``), SST-2,
  batch 64, sentences cut to 32 tokens (Hugging Face's BertForSequenceClassification on dict batches).

    .venv/bin/python benchmarks/bench_secure_mode.py                       # cnn, 5 rounds x 5 steps
    .venv/bin/python benchmarks/bench_secure_mode.py --quick               # cnn, 2 rounds x 2 steps
    .venv/bin/python benchmarks/bench_secure_mode.py --model minilm --rounds 2 --steps 1 --mechanisms gaussian lap2
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import torch
from timing import Candidate, fed_by_hand, interleaved
from torch.nn import functional as F
from torch.utils.data import DataLoader

from dpnoise.accounting import noise_keywords
from dpnoise.training import make_private

MECHANISMS = {"gaussian": 1.0, "lap2": 1.0, "laplace-l1": 1.0}
#: model -> (batch size, default rounds, default steps per round)
SETTINGS = {"cnn": (256, 5, 5), "minilm": (64, 2, 1)}

Step = Callable[[object], None]


def cnn_setup(batch_size: int, steps: int):
    from dpnoise.data import load_dataset
    from dpnoise.models.cnn import TFPrivacyTutorialCNN

    dataset = load_dataset("fashion-mnist", "train")
    indices = torch.randperm(len(dataset))[: batch_size * steps].view(steps, batch_size)
    return dataset, [dataset[i.tolist()] for i in indices], TFPrivacyTutorialCNN, {}


def minilm_setup(batch_size: int, steps: int):
    from dpnoise.data import TokenizedText, load_dataset, tokenize_for_classifier
    from dpnoise.models.minilm import minilm_sequence_classifier

    dataset = tokenize_for_classifier(load_dataset("sst2", "train"), max_length=32)
    indices = torch.randperm(len(dataset))[: batch_size * steps].view(steps, batch_size)
    batches = [TokenizedText.collate([dataset[j] for j in i.tolist()]) for i in indices]
    return dataset, batches, lambda: minilm_sequence_classifier(2, "all"), {"collate_fn": TokenizedText.collate}


def private_step(build_model, loader: DataLoader, mechanism: str, secure_mode: bool) -> Step:
    model = build_model()
    module, optimizer, _ = make_private(
        model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3), loader,
        mechanism=mechanism, **noise_keywords(mechanism, MECHANISMS[mechanism]), max_grad_norm=1.0, delta=1e-5,
        secure_mode=secure_mode,
    )
    fed_by_hand(optimizer)

    def step(batch) -> None:
        optimizer.zero_grad()
        if isinstance(batch, dict):
            module(**batch).loss.backward()
        else:
            F.cross_entropy(module(batch[0]), batch[1]).backward()
        optimizer.step()

    return step


def on_batches(step: Step, batches: list) -> Candidate:
    """The i-th call of ``step`` runs on batch i mod len(batches): every round sees the same batches."""
    return lambda i: (lambda: step(batches[i % len(batches)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=SETTINGS, default="cnn")
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    parser.add_argument("--rounds", type=int, help="interleaved measurement rounds (default: cnn 5, minilm 2)")
    parser.add_argument("--steps", type=int, help="steps per configuration per round (default: cnn 5, minilm 1)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of every configuration first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="2 rounds x 2 steps (unless --rounds/--steps say)")
    args = parser.parse_args()
    batch_size, rounds, steps = SETTINGS[args.model]
    if args.quick:
        rounds, steps = min(rounds, 2), min(steps, 2)
    rounds, steps = args.rounds or rounds, args.steps or steps
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)

    dataset, batches, build_model, collation = (cnn_setup if args.model == "cnn" else minilm_setup)(batch_size, steps)
    loader = DataLoader(dataset, batch_size=batch_size, **collation)
    candidates = {}
    for mechanism in args.mechanisms:
        for secure in (False, True):
            name = f"{mechanism}{'-secure' if secure else ''}"
            candidates[name] = on_batches(private_step(build_model, loader, mechanism, secure), batches)
    timings = interleaved(candidates, rounds, calls=steps, warmup=args.warmup)

    params = sum(p.numel() for p in build_model().parameters() if p.requires_grad)
    print(f"{args.model} ({params:,} trained parameters), batch {batch_size}, {args.threads} thread(s), "
          f"{rounds} rounds x {steps} steps, interleaved")
    print(f"{'mechanism':<14}{'default ms/step':>17}{'secure ms/step':>16}{'secure / default':>18}")
    for mechanism in args.mechanisms:
        default, secure = 1000 * timings.median(mechanism), 1000 * timings.median(f"{mechanism}-secure")
        print(f"{mechanism:<14}{default:>17.1f}{secure:>16.1f}{timings.ratio(f'{mechanism}-secure', mechanism):>17.2f}x")


if __name__ == "__main__":
    main()
