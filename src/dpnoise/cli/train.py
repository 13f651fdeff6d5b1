"""``dpnoise train``: train a model privately on a packaged dataset and report accuracy and epsilon.

Every option is checked (finite, in range, paths usable) before any data is loaded; torch, Opacus
and the data/model registries are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpnoise import checks

if TYPE_CHECKING:  # annotations only: torch is imported when the command runs
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from dpnoise.models import FeatureClassifier
    from dpnoise.training import PrivacyEngine
    from dpnoise.training.report import RunHistory

DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}
#: Choices of the options, kept here so that building the parser imports no torch (a test checks
#: them against dpnoise.data.DATASETS, dpnoise.models.MODELS, dpnoise.mechanisms.MECHANISMS and
#: dpnoise.training.GRAD_SAMPLE_MODES).
DATASET_CHOICES = ("cifar10-jpeg", "digits", "fashion-mnist", "mnist", "sst2")
MODEL_CHOICES = ("cnn", "resnet-gn", "resnet-gn-small", "minilm", "minilm-features", "efficientnet-lite0-features")
TEXT_MODELS = ("minilm", "minilm-features")
MECHANISM_CHOICES = ("dirichlet", "gaussian", "lap2", "laplace-l1", "penultimate-gaussian")
GRAD_SAMPLE_MODE_CHOICES = ("auto", "bookkeeping", "hooks")
#: MiniLM-L6 has 512 positions; [CLS] and [SEP] take two
MAX_LENGTH_RANGE = (2, 512)
CHECKPOINT_NAME = "checkpoint.pt"
EVAL_BATCH_SIZE = 1000
EXAMPLES = """examples:
  # the demo: Lap2 on Fashion-MNIST, seed CNN, epsilon 1 (both Lap2 epsilons are printed)
  dpnoise train --dataset fashion-mnist --model cnn --mechanism lap2 --epsilon 1 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --clip 1 --lr 1e-3 --out runs/lap2
  # a fixed noise instead of a target: b = 1.5 (absolute Laplace scale), no budget enforcement
  dpnoise train --dataset digits --model cnn --mechanism lap2 --noise 1.5 --delta 1e-5 \\
      --epochs 5 --batch-size 64
  # Dirichlet mechanism, SGD with the learning rate from seed 2's effective-learning-rate heuristic
  dpnoise train --dataset mnist --model cnn --mechanism dirichlet --epsilon 4 --delta 1e-5 \\
      --epochs 2 --batch-size 256 --alpha 1 --optimizer sgd --effective-lr 0.1 --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model privately (gaussian, lap2, laplace-l1, dirichlet, penultimate-gaussian)",
        description="Train a model with differential privacy on a packaged dataset (no downloads). "
        "Shows a progress bar (loss, training-batch accuracy, epsilon so far), then prints the test "
        "accuracy and the epsilon under every accountant that applies (for lap2: the sound 'lap2' "
        "accountant and the seed's published 'lap2-paper' one, which is NOT a valid bound in "
        "general). Batches are Poisson-sampled; the accountants are stepped once per optimizer step.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to train")
    what.add_argument("--dataset", required=True, choices=DATASET_CHOICES,
                      help="packaged dataset (a missing one is reported with its install command)")
    what.add_argument("--model", default="cnn", choices=MODEL_CHOICES,
                      help="cnn: the seeds' 4-layer CNN (default); resnet-gn: GroupNorm ResNet (0.31M parameters; "
                      "resnet-gn-small: half width, 78k); minilm: "
                      "MiniLM-L6 for sst2 (last encoder block, pooler and head trained); minilm-features: "
                      "frozen MiniLM-L6 sentence embeddings (mean pooled, computed once and cached), only "
                      "a linear head is trained (sst2); efficientnet-lite0-features: frozen ImageNet "
                      "backbone, features cached, only the linear head is trained (RGB datasets)")
    what.add_argument("--limit", type=int, help="train on a deterministic class-balanced subset of this size")
    what.add_argument("--test-limit", type=int, help="evaluate on a class-balanced test subset of this size")
    what.add_argument("--data-root", type=Path, help="folder with the dataset files instead of the default place")
    what.add_argument("--max-length", type=int, default=64, help="token length for text datasets (default 64)")

    privacy = p.add_argument_group("privacy")
    privacy.add_argument("--mechanism", required=True, choices=MECHANISM_CHOICES,
                         help="gaussian: DP-SGD (L2 clipping, Gaussian noise); lap2: L2 clipping, Laplace "
                         "noise; laplace-l1: exact L1 clipping, Laplace noise; dirichlet: Dirichlet output "
                         "mechanism (inputs private, labels public); penultimate-gaussian: clipped, noised "
                         "penultimate activations (reconstructed baseline). The last two protect the "
                         "released outputs, not the parameters (spec dirichlet.md §5)")
    privacy.add_argument("--epsilon", type=float,
                         help="target epsilon: calibrates the noise for --epochs (unless --noise is "
                         "given) and stops training before the budget is exceeded")
    privacy.add_argument("--noise", type=float,
                         help="noise in the mechanism's units instead of calibrating: gaussian and "
                         "penultimate-gaussian sigma (std sigma*C); lap2 and laplace-l1 the ABSOLUTE "
                         "Laplace scale b on the sum of clipped gradients; dirichlet the scale r")
    privacy.add_argument("--delta", type=float, required=True, help="target delta, e.g. 1e-5")
    privacy.add_argument("--clip", type=float, default=1.0,
                         help="clipping norm C: per-example gradient L2 norm (gaussian, lap2), L1 norm "
                         "(laplace-l1), or penultimate activation L2 norm; unused by dirichlet (default 1)")
    privacy.add_argument("--alpha", type=float, default=1.0, help="Dirichlet offset alpha > 0 (dirichlet only; default 1)")
    privacy.add_argument("--accountant",
                         help="primary accountant (budget and headline epsilon); default: the sound "
                         "default of the mechanism (lap2 for lap2). All applicable ones are reported")
    privacy.add_argument("--calibrate-with",
                         help="accountant used to calibrate the noise (default: the primary); "
                         "'lap2-paper' is allowed for reproducing the seed but warned: it is not a valid bound")
    privacy.add_argument("--grad-sample-mode", choices=GRAD_SAMPLE_MODE_CHOICES, default="auto",
                         help="per-example gradients of gradient mechanisms: 'hooks' (Opacus, every layer "
                         "materialised), 'bookkeeping' (dense layers clipped without materialising; same "
                         "clipped sums, faster) or 'auto' (default: bookkeeping where every layer supports it)")

    optim = p.add_argument_group("optimisation")
    optim.add_argument("--epochs", type=float, required=True,
                       help="epochs E; the run takes ceil(E / q) Poisson-sampled steps, q = batch/N")
    optim.add_argument("--batch-size", type=int, required=True, help="expected (Poisson) batch size B")
    optim.add_argument("--optimizer", choices=sorted(DEFAULT_LR), default="adam", help="default adam")
    optim.add_argument("--lr", type=float, help="learning rate (default: 1e-3 for adam, 0.1 for sgd)")
    optim.add_argument("--effective-lr", type=float,
                       help="dirichlet only, instead of --lr: lr = effective_lr / kappa(s_y=0.9; r, alpha), "
                       "seed 2's heuristic for SGD (spec dirichlet.md §4). Adam already normalises the "
                       "gradient scale, so with adam this mostly just raises the lr")
    optim.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0)")
    optim.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default 0; seed 1 used 1e-4)")
    optim.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing (default 0; seed 1 used 0.15)")
    optim.add_argument("--max-steps", type=int,
                       help="stop after this many steps in total (the noise is still calibrated for --epochs)")

    run_group = p.add_argument_group("run")
    run_group.add_argument("--seed", type=int, default=0, help="seed for model init, Poisson sampling and noise (default 0)")
    run_group.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    run_group.add_argument("--out", type=Path,
                           help="write metrics.json, steps.csv, epochs.csv, curves.png and checkpoint.pt here")
    run_group.add_argument("--resume", type=Path, help="continue from a checkpoint written by --out")
    run_group.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    run_group.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point; known failures (:class:`~dpnoise.errors.DpnoiseError`) become one line and
    exit status 2 in :func:`dpnoise.cli.main.main`."""
    return train(args)


def load_splits(args: argparse.Namespace, normalize: bool = True) -> tuple[Dataset, Dataset]:
    """Train and test datasets of (input, label) tensors; text is tokenised for MiniLM."""
    from dpnoise.data import dataset_info, load_dataset

    train_set = load_dataset(args.dataset, "train", args.data_root, limit=args.limit, normalize=normalize)
    test_set = load_dataset(args.dataset, "test", args.data_root, limit=args.test_limit, normalize=normalize)
    if dataset_info(args.dataset).modality == "text":
        from dpnoise.data import minilm_tokenizer, tokenize

        tokenizer = minilm_tokenizer()
        train_set = tokenize(train_set, args.max_length, tokenizer)
        test_set = tokenize(test_set, args.max_length, tokenizer)
    return train_set, test_set


def model_for_dataset(args: argparse.Namespace) -> nn.Module:
    """``args.model`` sized for ``args.dataset`` (classes, channels, image side)."""
    from dpnoise.data import dataset_info
    from dpnoise.models import build_model

    info = dataset_info(args.dataset)
    image = info.modality == "image"
    return build_model(args.model, num_classes=info.num_classes,
                       in_channels=info.input_shape[0] if image else None,
                       input_size=info.input_shape[-1] if image else None)


def frozen_features(model: FeatureClassifier, args: argparse.Namespace) -> tuple[Dataset, Dataset]:
    """Train and test features of ``model``'s frozen encoder (computed once, then read from the cache)."""
    from dpnoise.models import extract_features

    train_inputs, test_inputs = load_splits(args, normalize=False)
    return extract_features(model, train_inputs), extract_features(model, test_inputs)


def prepare_model_and_data(args: argparse.Namespace) -> tuple[nn.Module, Dataset, Dataset]:
    """The trainable model sized for the dataset, with its train and test data.

    For the ``*-features`` models the frozen public encoder (ImageNet EfficientNet-Lite0 with
    BatchNorm in eval mode, or MiniLM-L6 sentence embeddings) maps each example to features once,
    and only the linear head is trained privately.
    """
    from dpnoise.models import FeatureClassifier

    model = model_for_dataset(args)
    if not isinstance(model, FeatureClassifier):
        return (model, *load_splits(args))
    return (model.head, *frozen_features(model, args))


def build_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    import torch

    lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
    trainable = [p for p in model.parameters() if p.requires_grad]
    if args.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(trainable, lr=lr, momentum=args.momentum, weight_decay=args.weight_decay)


def apply_dirichlet_learning_rate(args: argparse.Namespace, optimizer: torch.optim.Optimizer, engine: PrivacyEngine) -> None:
    """With --effective-lr: lr = effective lr / kappa(0.9; r, alpha) (spec dirichlet.md §4)."""
    from dpnoise.mechanisms import dirichlet_learning_rate

    if args.effective_lr is None:
        return
    lr = dirichlet_learning_rate(args.effective_lr, engine.setup.noise, engine.setup.alpha)
    for group in optimizer.param_groups:
        group["lr"] = lr


def check_options(args: argparse.Namespace) -> None:
    """Check every option before any work; errors name the flag (no torch needed)."""
    if args.epsilon is None and args.noise is None:
        raise checks.InvalidParameterError("give --epsilon (calibrate the noise) or --noise (fixed noise), or both")
    if args.effective_lr is not None and (args.mechanism != "dirichlet" or args.lr is not None):
        raise checks.InvalidParameterError("--effective-lr applies to --mechanism dirichlet without --lr")
    checks.optional(checks.check_positive, "--epsilon", args.epsilon)
    checks.optional(checks.check_positive, "--noise", args.noise)
    checks.check_delta("--delta", args.delta)
    checks.check_positive("--clip", args.clip)
    checks.check_positive("--alpha", args.alpha)
    checks.check_positive("--epochs", args.epochs)
    checks.check_count("--batch-size", args.batch_size, 1)
    checks.optional(checks.check_positive, "--lr", args.lr)
    checks.optional(checks.check_positive, "--effective-lr", args.effective_lr)
    checks.fraction("--momentum", args.momentum)
    checks.nonnegative("--weight-decay", args.weight_decay)
    checks.fraction("--label-smoothing", args.label_smoothing)
    checks.optional(checks.check_count, "--max-steps", args.max_steps, 1)
    checks.optional(checks.check_count, "--limit", args.limit, 1)
    checks.optional(checks.check_count, "--test-limit", args.test_limit, 1)
    checks.count_in("--max-length", args.max_length, *MAX_LENGTH_RANGE)
    checks.seed("--seed", args.seed)
    checks.optional(checks.check_count, "--threads", args.threads, 1)
    checks.optional(checks.existing_folder, "--data-root", args.data_root)
    checks.optional(checks.output_folder, "--out", args.out)
    checks.optional(checks.checkpoint_file, "--resume", args.resume)


def check_against_registries(args: argparse.Namespace) -> None:
    """The checks that need the dataset sizes and the mechanism's accountants (torch imported)."""
    from dpnoise.accounting import accountants_for_mechanism
    from dpnoise.data import dataset_info
    from dpnoise.mechanisms import MECHANISMS

    info = dataset_info(args.dataset)
    if (args.model in TEXT_MODELS) != (info.modality == "text"):
        raise checks.InvalidParameterError(
            f"--model {args.model} cannot be trained on the {info.modality} dataset {args.dataset}")
    if args.model == "efficientnet-lite0-features" and info.input_shape[0] != 3:
        raise checks.InvalidParameterError(f"--model {args.model} needs RGB images; {args.dataset} is not RGB")
    for flag, limit, size in (("--limit", args.limit, info.train_size), ("--test-limit", args.test_limit, info.test_size)):
        if limit is not None and limit > size:
            raise checks.InvalidParameterError(f"{flag} must be <= {size} (the {args.dataset} split's size), got {limit}")
    train_size = args.limit or info.train_size
    if args.batch_size > train_size:
        raise checks.InvalidParameterError(
            f"--batch-size must be <= {train_size} (the training set's size; q = batch / N <= 1), got {args.batch_size}")
    checks.finite_steps("--epochs", args.epochs, args.batch_size / train_size)
    applicable = accountants_for_mechanism(args.mechanism, include_options=True)
    for flag, name in (("--accountant", args.accountant), ("--calibrate-with", args.calibrate_with)):
        if name is not None and name not in applicable:
            raise checks.InvalidParameterError(
                f"{flag} {name!r} does not apply to --mechanism {args.mechanism}; choose from {', '.join(applicable)}")


def train(args: argparse.Namespace) -> int:
    check_options(args)
    import torch
    from torch.utils.data import DataLoader

    from dpnoise.accounting import UnsoundAccountantWarning, noise_keywords
    from dpnoise.errors import DpnoiseError
    from dpnoise.training import PrivacyEngine, load_checkpoint
    from dpnoise.training.report import RunHistory, write_run_outputs

    check_against_registries(args)
    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, train_set, test_set = prepare_model_and_data(args)
    optimizer = build_optimizer(args, model)
    engine = PrivacyEngine(seed=args.seed)
    module, optimizer, loader = engine.make_private(
        model, optimizer, DataLoader(train_set, batch_size=args.batch_size),
        mechanism=args.mechanism, delta=args.delta, **noise_keywords(args.mechanism, args.noise), target_epsilon=args.epsilon,
        epochs=args.epochs, max_grad_norm=args.clip,
        alpha=args.alpha if args.mechanism == "dirichlet" else None,
        accountant=args.accountant, calibrate_with=args.calibrate_with, on_budget_exhausted="stop",
        grad_sample_mode=args.grad_sample_mode,
    )
    apply_dirichlet_learning_rate(args, optimizer, engine)
    history = RunHistory()
    if args.resume:
        try:
            extra = load_checkpoint(args.resume, module=module, optimizer=optimizer, engine=engine)
        except DpnoiseError as err:  # unreadable, tampered or from another setup: name the flag
            raise checks.InvalidParameterError(f"--resume: {err}") from err
        history = RunHistory.from_dict(extra["history"])
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH_SIZE)
    total_steps = min(engine.planned_steps, args.max_steps or engine.planned_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)  # stated in the final report
        # Opacus's hooks on the first layer trigger this torch notice on every run; it is harmless.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        run_epochs(args, module, optimizer, loader, test_loader, engine, history, total_steps)
        summary = summarize(args, engine, optimizer, history, len(train_set), time.perf_counter() - started)
    if args.out:
        summary["files"] = [str(p) for p in write_run_outputs(args.out, summary, history)]
    if args.json:
        print(json.dumps(summary))
    else:
        print("\n".join(summary_lines(summary)))
    return 0


def next_epoch_end(steps: int, sample_rate: float) -> int:
    """First epoch boundary after ``steps``: epoch k ends at step ceil(k / q), as in the calibration."""
    epoch = math.floor(steps * sample_rate + 1e-9) + 1
    while math.ceil(epoch / sample_rate - 1e-9) <= steps:
        epoch += 1
    return math.ceil(epoch / sample_rate - 1e-9)


def run_epochs(
    args: argparse.Namespace, module: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
    test_loader: DataLoader, engine: PrivacyEngine, history: RunHistory, total_steps: int,
) -> None:
    """Train to ``total_steps``, evaluating (and checkpointing with --out) after every epoch."""
    from torch.nn import functional as F
    from tqdm import tqdm

    from dpnoise.training import endless_batches, evaluate_accuracy, save_checkpoint, train_steps
    from dpnoise.training.loop import StepMetrics
    from dpnoise.training.report import EpochRecord, StepRecord

    sample_rate = engine.setup.sample_rate
    loss_fn = lambda outputs, targets: F.cross_entropy(outputs, targets, label_smoothing=args.label_smoothing)  # noqa: E731
    batches = endless_batches(loader)
    # Redraw rarely when stderr is a log file, not a terminal (keeps logs readable).
    bar = tqdm(total=total_steps, initial=engine.steps, desc=args.mechanism, unit="step",
               disable=args.no_progress, file=sys.stderr, dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 15.0)

    def on_step(metrics: StepMetrics) -> None:
        record = StepRecord(metrics.step, metrics.step * sample_rate, metrics.loss, metrics.batch_accuracy,
                            metrics.batch_size, engine.get_quick_epsilon())
        history.steps.append(record)
        window = history.steps[-20:]
        bar.set_postfix(loss=f"{sum(s.loss for s in window) / len(window):.3f}",
                        acc=f"{sum(s.batch_accuracy for s in window) / len(window):.3f}",
                        eps=f"{record.epsilon:.3f}", refresh=False)
        bar.update(1)

    while engine.steps < total_steps and not engine.budget_exhausted:
        next_boundary = min(next_epoch_end(engine.steps, sample_rate), total_steps)
        train_steps(module, optimizer, batches, engine, next_boundary - engine.steps, loss_fn=loss_fn, on_step=on_step)
        history.epochs.append(EpochRecord(engine.steps * sample_rate, engine.steps,
                                          evaluate_accuracy(module, test_loader), engine.epsilon_by_accountant()))
        bar.write(f"step {engine.steps}: test accuracy {history.epochs[-1].test_accuracy:.4f}, "
                  f"epsilon ({engine.setup.accountant}) {engine.get_epsilon():.4f}", file=sys.stderr)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            save_checkpoint(args.out / CHECKPOINT_NAME, module=module, optimizer=optimizer, engine=engine,
                            extra={"history": history.to_dict()})
    bar.close()


def summarize(
    args: argparse.Namespace, engine: PrivacyEngine, optimizer: torch.optim.Optimizer, history: RunHistory,
    train_size: int, wall_time: float,
) -> dict[str, Any]:
    """The run's result as one JSON-able dictionary."""
    from dpnoise.accounting import ACCOUNTANTS
    from dpnoise.mechanisms import MECHANISMS, kappa
    from dpnoise.mechanisms.dirichlet import KAPPA_REFERENCE_PROBABILITY

    setup = engine.setup
    by_accountant = engine.epsilon_by_accountant()
    summary: dict[str, Any] = {
        "test_accuracy": history.epochs[-1].test_accuracy if history.epochs else None,
        "epsilon": by_accountant[setup.accountant],
        "epsilon_by_accountant": by_accountant,
        "sound_by_accountant": {name: ACCOUNTANTS[name].sound for name in by_accountant},
        "accountant": setup.accountant,
        "delta": setup.delta,
        "target_epsilon": setup.target_epsilon,
        "steps": engine.steps,
        "planned_steps": engine.planned_steps,
        "budget_exhausted": engine.budget_exhausted,
        "mechanism": setup.mechanism,
        "dataset": args.dataset,
        "model": args.model,
        "train_size": train_size,
        "params": setup.params,
        "noise": setup.noise,
        "noise_unit": MECHANISMS[setup.mechanism].spec.noise.unit,
        "clip": setup.clip,
        "sample_rate": setup.sample_rate,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "optimizer": args.optimizer,
        "lr": optimizer.param_groups[0]["lr"],
        "seed": args.seed,
        "scope": engine.scope_statement,
        "grad_sample_mode": engine.grad_sample_mode,
        "wall_time_s": wall_time,
    }
    if setup.alpha is not None:
        summary["alpha"] = setup.alpha
        summary["kappa_at_0.9"] = kappa(KAPPA_REFERENCE_PROBABILITY, setup.noise, setup.alpha)
    if engine.calibration is not None:
        summary["calibrated_with"] = engine.calibration.accountant
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable report of :func:`summarize`'s dictionary."""
    lines = [
        f"test accuracy: {summary['test_accuracy']:.4f}  ({summary['dataset']}, model {summary['model']}, "
        f"{summary['steps']} steps, {summary['wall_time_s']:.0f} s)",
        f"mechanism {summary['mechanism']}: noise {summary['noise']:.6g} ({summary['noise_unit']}), "
        f"clip {summary['clip']:g}, sample rate {summary['sample_rate']:.6g}, lr {summary['lr']:.3g}",
        f"epsilon at delta={summary['delta']:g}:",
    ]
    for name, eps in summary["epsilon_by_accountant"].items():
        role = "primary" if name == summary["accountant"] else "side by side"
        validity = "proven upper bound" if summary["sound_by_accountant"][name] else "NOT a valid privacy bound"
        if summary["scope"] and summary["sound_by_accountant"][name]:
            validity += " for the released outputs only, see scope"
        lines.append(f"  {name:>22}: {eps:.4f}  ({role}; {validity})")
    if summary["budget_exhausted"]:
        lines.append(f"stopped at the privacy budget epsilon={summary['target_epsilon']:g} after {summary['steps']} steps")
    if summary["scope"]:
        lines.append(summary["scope"])
    if summary.get("files"):
        lines.append("wrote " + ", ".join(summary["files"]))
    return lines
