"""``dpnoise train``: train a model privately on a packaged dataset and report accuracy and epsilon.

The options become a :class:`~dpnoise.training.TrainingConfig` for :func:`~dpnoise.training.train_private`.
Every option is checked first, without torch (finite, in range, paths usable); the library's errors name
its configuration fields, which are printed as the flags below (:data:`OPTIONS`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpnoise import checks
from dpnoise.accounting import MECHANISMS
from dpnoise.cli.common import accountant_names, mechanism_help, noise_help

#: Choices of the options, kept here so that building the parser imports no torch (a test checks them against
#: dpnoise.data.DATASETS, dpnoise.models.MODELS, dpnoise.training.GRAD_SAMPLE_MODES).
DATASET_CHOICES = ("cifar10-jpeg", "digits", "fashion-mnist", "mnist", "sst2")
MODEL_CHOICES = ("cnn", "resnet-gn", "resnet-gn-small", "minilm", "minilm-features", "efficientnet-lite0-features",
                 "scatternet-linear", "scatternet-cnn")
TEXT_MODELS = ("minilm", "minilm-features")
MECHANISM_CHOICES = tuple(sorted(MECHANISMS))
GRAD_SAMPLE_MODE_CHOICES = ("auto", "bookkeeping", "hooks")
OPTIMIZER_CHOICES = ("adam", "sgd")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
NOISE_SHARES_CHOICES = ("split", "rank0")
LR_SCHEDULE_CHOICES = ("constant", "cosine")
RECIPE_CHOICES = ("scatternet",)
TRAINABLE_CHOICES = ("last-block", "all", "no-embeddings", "lora", "head")
EVAL_SPLIT_CHOICES = ("test", "dev")
#: configuration field <- (flag, check of dpnoise.checks and its extra arguments): builds the configuration, checks
#: the options in this order before any work (the library repeats them) and names the flags in the library's errors
OPTIONS = {
    "privacy.epsilon": ("--epsilon", "check_positive"), "mechanism.noise": ("--noise", "check_positive"),
    "privacy.delta": ("--delta", "check_delta"), "mechanism.clip": ("--clip", "check_positive"),
    "mechanism.alpha": ("--alpha", "check_positive"), "schedule.epochs": ("--epochs", "check_positive"),
    "schedule.batch_size": ("--batch-size", "check_count", 1), "optimizer.lr": ("--lr", "check_positive"),
    "optimizer.effective_lr": ("--effective-lr", "check_positive"), "optimizer.momentum": ("--momentum", "fraction"),
    "optimizer.weight_decay": ("--weight-decay", "nonnegative"),
    "optimizer.label_smoothing": ("--label-smoothing", "fraction"),
    "schedule.max_steps": ("--max-steps", "check_count", 1), "data.limit": ("--limit", "check_count", 1),
    "data.test_limit": ("--test-limit", "check_count", 1), "data.max_length": ("--max-length", "count_in", 2, 512),
    "seed": ("--seed", "seed"), "noise_seed": ("--noise-seed", "seed"), "threads": ("--threads", "check_count", 1),
    "data.root": ("--data-root", "existing_folder"), "output.folder": ("--out", "output_folder"),
    "output.resume": ("--resume", "checkpoint_file"), "data.name": ("--dataset",), "model": ("--model",),
    "mechanism.name": ("--mechanism",), "privacy.accountant": ("--accountant",),
    "privacy.calibrate_with": ("--calibrate-with",), "mechanism.grad_sample_mode": ("--grad-sample-mode",),
    "optimizer.name": ("--optimizer",), "output.progress": ("--no-progress",), "device": ("--device",),
    "mechanism.noise_shares": ("--noise-shares",),
    "schedule.physical_batch_size": ("--physical-batch-size", "check_count", 1),
    "optimizer.ema_decay": ("--ema-decay", "open_fraction"), "optimizer.lr_schedule": ("--lr-schedule",),
    "data.feature_statistics_noise": ("--feature-statistics-noise", "check_positive"),
    "trainable": ("--trainable",), "lora_rank": ("--lora-rank", "check_count", 1), "data.eval_split": ("--eval-split",),
    "secure_mode": ("--secure-mode",),
}
EXAMPLES = """examples:
  # the demo: Lap2 on Fashion-MNIST, seed CNN, epsilon 1 (both Lap2 epsilons are printed)
  dpnoise train --dataset fashion-mnist --model cnn --mechanism lap2 --epsilon 1 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --clip 1 --lr 1e-3 --out runs/lap2
  # a fixed noise instead of a target: b = 1.5 (absolute Laplace scale), no budget enforcement
  dpnoise train --dataset digits --model cnn --mechanism lap2 --noise 1.5 --delta 1e-5 \\
      --epochs 5 --batch-size 64
  # Dirichlet mechanism, SGD with the learning rate from the Dirichlet-mechanism paper's effective-learning-rate heuristic
  dpnoise train --dataset mnist --model cnn --mechanism dirichlet --epsilon 4 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --alpha 1 --optimizer sgd --effective-lr 0.1 --json
  # Tramer & Boneh's recipe (ScatterNet + linear, SGD momentum 0.9, clip 0.1, batch 8192, lr 16, 40 epochs,
  # epsilon 3 at delta 1e-5) for lap2, in physical batches of 2048; any option overrides the recipe
  dpnoise train --recipe scatternet --dataset fashion-mnist --mechanism lap2 --out runs/scatternet
  # two processes on one machine (docs/DISTRIBUTED.md): each samples half of the data at the same rate
  torchrun --nproc-per-node 2 -m dpnoise train --dataset digits --mechanism lap2 --epsilon 2 --delta 1e-5 \
      --epochs 5 --batch-size 64 --threads 1
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model privately (gaussian, lap2, laplace-l1, dirichlet, penultimate-gaussian)",
        description="Train a model with differential privacy on a packaged dataset (no downloads). Shows a progress "
        "bar (loss, training-batch accuracy, epsilon so far), then prints the test accuracy and the epsilon under every "
        "accountant that applies (for lap2: the sound 'lap2' accountant and the Lap2 paper's published 'lap2-paper' one, "
        "which is NOT a valid bound in general). Batches are Poisson-sampled; the accountants are stepped once per "
        "optimizer step.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument_group("what to train").add_argument
    add("--dataset", required=True, choices=DATASET_CHOICES,
        help="packaged dataset (a missing one is reported with its install command)")
    add("--recipe", choices=RECIPE_CHOICES, help="published hyper-parameters as defaults for the options below; options "
        "given explicitly win. scatternet: Tramer & Boneh 2021 (arXiv 2011.11660) for mnist, fashion-mnist and "
        "cifar10-jpeg with scatternet-linear (default) or scatternet-cnn: SGD momentum 0.9, clip 0.1, their batch size, "
        "lr and epochs, physical batches of 2048, epsilon 3 at delta 1e-5 (dpnoise.training.recipes)")
    add("--model", choices=MODEL_CHOICES, help="cnn: the TensorFlow Privacy tutorial's 4-layer CNN (default); resnet-gn: "
        "GroupNorm ResNet (0.31M parameters; resnet-gn-small: half width, 78k); minilm: MiniLM-L6 for sst2, Hugging "
        "Face's BertForSequenceClassification fine-tuned on the tokenizer's ids and attention masks (which parameters: "
        "--trainable); minilm-features: frozen MiniLM-L6 sentence embeddings (mean pooled, "
        "computed once and cached), only a linear head is trained (sst2); efficientnet-lite0-features: frozen ImageNet "
        "backbone, features cached, only the linear head is trained (RGB datasets); scatternet-linear / scatternet-cnn: "
        "frozen ScatterNet features (kymatio, J=2, L=8, computed once and cached) under GroupNorm and a linear or small "
        "CNN head (Tramer & Boneh 2021; needs the train extra)")
    add("--trainable", choices=TRAINABLE_CHOICES, help="minilm only, which parameters are fine-tuned: last-block "
        "(default: the last encoder block, the pooler and the head, 1.9M parameters), all (full fine-tuning, 22.7M), "
        "no-embeddings (all but the token, position and token-type embeddings, 10.8M), lora (LoRA adapters of rank "
        "--lora-rank on the attention's query and value projections, and the head: 74,498 at rank 8; needs peft), head "
        "(the pooler and the head, 148,610). Lap2's accountant is given the number trained")
    add("--lora-rank", type=int, metavar="R", help="--trainable lora only: the rank of the adapters (default 8; "
        "scaling alpha / R = 2)")
    add("--limit", type=int, help="train on a deterministic class-balanced subset of this size")
    add("--test-limit", type=int, help="evaluate on a class-balanced subset of this size of the evaluation split")
    add("--eval-split", choices=EVAL_SPLIT_CHOICES, help="the split evaluated after every epoch: test (default), or dev "
        "(sst2: GLUE's 872 validation sentences, where published SST-2 accuracies are measured)")
    add("--data-root", type=Path, help="folder with the dataset files instead of the default place")
    add("--max-length", type=int, help="text datasets: sentences are cut to this many tokens, [CLS] and [SEP] included "
        "(2 to 512, default 64; MiniLM-L6's own tokenizer); each batch is padded to its own longest sentence")
    add("--feature-statistics-noise", type=float, metavar="SIGMA", help="scatternet models: standardise the features "
        "per channel with their mean and variance released with Gaussian noise of multiplier SIGMA (clipping thresholds "
        "from noisy quantiles; 4 Gaussian releases, composed into every accountant and the calibration) instead of "
        "GroupNorm; Tramer & Boneh used 8 (default: GroupNorm, no privacy cost)")
    add = p.add_argument_group("privacy").add_argument
    add("--mechanism", required=True, choices=MECHANISM_CHOICES, help=f"{mechanism_help()}. Output mechanisms protect "
        "the released outputs, not the parameters (docs/theory/dirichlet.md §5)")
    add("--epsilon", type=float, help="target epsilon: calibrates the noise for --epochs (unless --noise is given) and "
        "stops training before the budget is exceeded")
    add("--noise", type=float, help=f"fixed noise instead of calibrating; {noise_help()}")
    add("--delta", type=float, help="target delta, e.g. 1e-5 (required unless a --recipe sets it)")
    add("--clip", type=float, help="clipping norm C: per-example gradient L2 norm (gaussian, lap2), L1 "
        "norm (laplace-l1), or penultimate activation L2 norm; unused by dirichlet (default 1)")
    add("--alpha", type=float, help="Dirichlet offset alpha > 0 (dirichlet only; default 1)")
    add("--accountant", metavar="NAME", help="primary accountant (budget and headline epsilon); default: the sound default of the "
        "mechanism. All applicable ones are reported. One of: " + ", ".join(accountant_names()))
    add("--calibrate-with", metavar="NAME", help="accountant used to calibrate the noise to --epsilon (default: the primary; "
        "refused with --noise, where nothing is calibrated); 'lap2-paper' is allowed for reproducing the Lap2 paper but "
        "warned: it is not a valid bound")
    add("--grad-sample-mode", choices=GRAD_SAMPLE_MODE_CHOICES, help="per-example gradients of "
        "gradient mechanisms: 'hooks' (Opacus, every layer materialised), 'bookkeeping' (dense layers clipped without "
        "materialising; same clipped sums, faster) or 'auto' (default: bookkeeping where every layer supports it)")
    add = p.add_argument_group("optimisation").add_argument
    add("--epochs", type=float, help="epochs E; the run takes ceil(E / q) Poisson-sampled steps, q = batch/N "
        "(required unless a --recipe sets it)")
    add("--batch-size", type=int, help="expected (Poisson) batch size B (required unless a --recipe sets it)")
    add("--physical-batch-size", type=int, help="process each Poisson batch in pieces of at most this many examples: "
        "their clipped gradients are summed and noised once, the same step in less memory (default: one piece)")
    add("--optimizer", choices=OPTIMIZER_CHOICES, help="default adam")
    add("--lr", type=float, help="learning rate (default: 1e-3 for adam, 0.1 for sgd)")
    add("--effective-lr", type=float, help="dirichlet only, instead of --lr: lr = effective_lr / kappa(s_y=0.9; r, "
        "alpha), the Dirichlet-mechanism paper's heuristic for SGD (docs/theory/dirichlet.md §4). Adam already normalises the gradient scale, so with "
        "adam this mostly just raises the lr")
    add("--lr-schedule", choices=LR_SCHEDULE_CHOICES, help="constant (default) or cosine: the lr decays to 0 over "
        "the planned steps")
    add("--momentum", type=float, help="SGD momentum (--optimizer sgd only; default 0)")
    add("--weight-decay", type=float, help="weight decay (default 0; the Lap2 paper used 1e-4)")
    add("--label-smoothing", type=float, help="label smoothing (default 0; the Lap2 paper used 0.15)")
    add("--ema-decay", type=float, help="evaluate an exponential moving average of the parameters with this decay in "
        "(0, 1), warmed up as min(decay, (1+t)/(10+t)); free post-processing of the private iterates (default: none)")
    add("--max-steps", type=int,
        help="stop after this many steps in total (the noise is still calibrated for --epochs)")
    add = p.add_argument_group("run").add_argument
    add("--seed", type=int, help="public seed for model initialisation and data-loader workers (default 0); "
        "the noise and the Poisson sampling are secret, seeded from the operating system's entropy")
    add("--noise-seed", type=int, help="seed the noise and the Poisson sampling too, for a reproducible run: anyone "
        "who knows it can regenerate the noise and remove it (warned); default: secret")
    add("--secure-mode", action="store_true", help="floating-point-safe noise nobody can predict (gaussian, lap2, "
        "laplace-l1): each step releases grid * (round(S / grid) + Z), S the clipped sum rounded onto a power-of-two "
        "grid, Z exact integer noise (floored Laplace; the discrete Gaussian of Canonne, Kamath & Steinke) drawn with "
        "integer arithmetic from the operating system's cryptographically secure generator, so that neither the "
        "noise nor the low bits of the released gradients reveal the data (docs/theory/secure_noise.md). The noise is "
        "raised by the rounding's factor C'/C (at most 1 + 2^-10, reported with the grid); Laplace epsilons are "
        "unchanged, Gaussian ones carry the discrete Gaussian's correction (far below double precision, rounded up). "
        "The noise is drawn on the CPU: it adds tens of milliseconds to a step of the tutorial CNN and 10 "
        "to 25 s to one of MiniLM full fine-tuning (benchmarks/README.md). One process only; refused with --noise-seed "
        "and --feature-statistics-noise")
    add("--threads", type=int, help="torch CPU threads (default: torch's choice; per process under torchrun)")
    add("--device", choices=DEVICE_CHOICES, help="auto (default): cuda when available, else cpu")
    add("--noise-shares", choices=NOISE_SHARES_CHOICES, help="under torchrun: split (default; every "
        "process adds one of K independent noise shares) or rank0 (rank 0 adds all the noise); docs/DISTRIBUTED.md")
    add("--out", type=Path, help="write metrics.json, steps.csv, epochs.csv, curves.png and checkpoint.pt here")
    add("--resume", type=Path, help="continue from a checkpoint written by --out")
    add("--json", action="store_true", help="print one JSON object instead of text")
    add("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def option(args: argparse.Namespace, flag: str):  # the value of --flag-name
    return getattr(args, flag[2:].replace("-", "_"))


def configuration_fields(args: argparse.Namespace) -> dict:
    """The configuration's fields from the options given (and the ``--recipe``'s for the others)."""
    from dpnoise.training.recipes import apply_recipe

    values = {field: option(args, flag) for field, (flag, *_) in OPTIONS.items()}
    values["output.progress"] = not args.no_progress
    if args.recipe:
        values = apply_recipe(values, args.recipe)
    for flag, field in (("--delta", "privacy.delta"), ("--epochs", "schedule.epochs"),
                        ("--batch-size", "schedule.batch_size")):
        if values.get(field) is None:
            raise checks.InvalidParameterError(f"give {flag} (or a --recipe that sets it)")
    return {field: value for field, value in values.items() if value is not None}  # the others keep their defaults


def check_options(args: argparse.Namespace) -> None:
    """Check every option before any work, without torch; errors name the flag."""
    if args.epsilon is None and args.noise is None and args.recipe is None:
        raise checks.InvalidParameterError("give --epsilon (calibrate the noise) or --noise (fixed noise), or both")
    if args.effective_lr is not None and (args.mechanism != "dirichlet" or args.lr is not None):
        raise checks.InvalidParameterError("--effective-lr applies to --mechanism dirichlet without --lr")
    if args.alpha is not None and not MECHANISMS[args.mechanism].uses_alpha:  # refused rather than ignored
        users = ", ".join(name for name, spec in MECHANISMS.items() if spec.uses_alpha)
        raise checks.InvalidParameterError(f"--alpha does not apply to --mechanism {args.mechanism} (only to {users})")
    for flag, *check in OPTIONS.values():
        if check:
            checks.optional(getattr(checks, check[0]), flag, option(args, flag), *check[1:])


def run(args: argparse.Namespace) -> int:
    """Entry point (a :class:`~dpnoise.errors.DpnoiseError` becomes one line and exit status 2 in ``main``)."""
    check_options(args)
    values = configuration_fields(args)
    from dpnoise.training import InvalidConfigError, TrainingConfig, train_private
    from dpnoise.training.summary import report_lines

    try:
        result = train_private(TrainingConfig.from_fields(values))
    except InvalidConfigError as err:  # the configuration's field names become the flags
        raise checks.InvalidParameterError(err.named(lambda field: OPTIONS[field][0])) from err
    if result.rank == 0:  # under torchrun, one report
        print(json.dumps(result.summary()) if args.json else "\n".join(report_lines(result.summary())))
    return 0
