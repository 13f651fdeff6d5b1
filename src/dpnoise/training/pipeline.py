"""One private training run from a configuration: :func:`train_private`.

>>> from dpnoise.training import (DataConfig, MechanismConfig, OptimizerConfig, PrivacyTarget,
...     Schedule, TrainingConfig, train_private)
>>> result = train_private(TrainingConfig(
...     data=DataConfig("digits"), mechanism=MechanismConfig("gaussian"),
...     privacy=PrivacyTarget(delta=1e-5, epsilon=2.0), schedule=Schedule(epochs=1, batch_size=64),
...     optimizer=OptimizerConfig(lr=0.05)))                                  # doctest: +SKIP
>>> result.test_accuracy, result.epsilon_by_accountant                         # doctest: +SKIP

This is what ``dpnoise train`` runs: check the configuration (before any data is loaded), prepare
the data and the model, make them private, train to the planned steps while evaluating (and
checkpointing into the output folder) after every epoch, and summarise.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from typing import TYPE_CHECKING

from dpnoise.training.config import CHECKPOINT_NAME, InvalidConfigError, TrainingConfig, check_config
from dpnoise.training.preparation import (
    apply_dirichlet_learning_rate,
    build_optimizer,
    check_against_registries,
    prepare_model_and_data,
)
from dpnoise.training.summary import TrainingResult, summarize

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from dpnoise.training.engine import PrivacyEngine
    from dpnoise.training.report import RunHistory

#: batch size of the test-set evaluation
EVAL_BATCH_SIZE = 1000


def train_private(config: TrainingConfig) -> TrainingResult:
    """Train ``config.model`` on ``config.data`` with ``config.mechanism`` and return the result.

    Every field is checked before any work (:class:`~dpnoise.training.config.InvalidConfigError`
    names the field).  With ``config.output.folder``, metrics.json, steps.csv, epochs.csv,
    curves.png and a checkpoint after every epoch are written there; ``config.output.resume``
    continues from such a checkpoint.  Progress goes to stderr; nothing is printed to stdout.
    """
    check_config(config)
    import torch
    from torch.utils.data import DataLoader

    from dpnoise.accounting import UnsoundAccountantWarning
    from dpnoise.errors import DpnoiseError
    from dpnoise.training.checkpoint import load_checkpoint
    from dpnoise.training.engine import PrivacyEngine
    from dpnoise.training.report import RunHistory, write_run_outputs

    check_against_registries(config)
    started = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    model, train_set, test_set = prepare_model_and_data(config)
    optimizer = build_optimizer(config, model)
    engine = PrivacyEngine(seed=config.seed)
    module, optimizer, loader = make_private(engine, config, model, optimizer,
                                             DataLoader(train_set, batch_size=config.schedule.batch_size))
    apply_dirichlet_learning_rate(config, optimizer, engine)
    history = RunHistory()
    if config.output.resume:
        try:
            extra = load_checkpoint(config.output.resume, module=module, optimizer=optimizer, engine=engine)
        except DpnoiseError as err:  # unreadable, tampered or from another setup: name the field
            problem = str(err)
            raise InvalidConfigError(lambda n: f"{n('output.resume')}: {problem}") from err
        history = RunHistory.from_dict(extra["history"])
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH_SIZE)
    total_steps = min(engine.planned_steps, config.schedule.max_steps or engine.planned_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)  # stated in the final report
        # Opacus's hooks on the first layer trigger this torch notice on every run; it is harmless.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        run_epochs(config, module, optimizer, loader, test_loader, engine, history, total_steps)
        result = summarize(config, engine, optimizer, history, len(train_set), time.perf_counter() - started)
    if config.output.folder:
        result = dataclasses.replace(result, files=tuple(write_run_outputs(config.output.folder, result.summary(),
                                                                           history)))
    return result


def make_private(
    engine: PrivacyEngine, config: TrainingConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
    loader: DataLoader,
) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    """``engine.make_private`` with the configuration's mechanism, noise and target (the one call)."""
    from dpnoise.accounting import noise_keywords

    mechanism, privacy = config.mechanism, config.privacy
    return engine.make_private(
        model, optimizer, loader,
        mechanism=mechanism.name, delta=privacy.delta, **noise_keywords(mechanism.name, mechanism.noise),
        target_epsilon=privacy.epsilon, epochs=config.schedule.epochs, max_grad_norm=mechanism.clip,
        alpha=mechanism.alpha if mechanism.name == "dirichlet" else None,
        accountant=privacy.accountant, calibrate_with=privacy.calibrate_with, on_budget_exhausted="stop",
        grad_sample_mode=mechanism.grad_sample_mode,
    )


def next_epoch_end(steps: int, sample_rate: float) -> int:
    """First epoch boundary after ``steps``: epoch k ends at step ceil(k / q), as in the calibration."""
    epoch = math.floor(steps * sample_rate + 1e-9) + 1
    while math.ceil(epoch / sample_rate - 1e-9) <= steps:
        epoch += 1
    return math.ceil(epoch / sample_rate - 1e-9)


def run_epochs(
    config: TrainingConfig, module: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
    test_loader: DataLoader, engine: PrivacyEngine, history: RunHistory, total_steps: int,
) -> None:
    """Train to ``total_steps``, evaluating (and checkpointing into the output folder) after every epoch."""
    from torch.nn import functional as F
    from tqdm import tqdm

    from dpnoise.training.checkpoint import save_checkpoint
    from dpnoise.training.loop import StepMetrics, endless_batches, evaluate_accuracy, train_steps
    from dpnoise.training.report import EpochRecord, StepRecord

    sample_rate = engine.setup.sample_rate
    label_smoothing = config.optimizer.label_smoothing
    loss_fn = lambda outputs, targets: F.cross_entropy(outputs, targets, label_smoothing=label_smoothing)  # noqa: E731
    batches = endless_batches(loader)
    # Redraw rarely when stderr is a log file, not a terminal (keeps logs readable).
    bar = tqdm(total=total_steps, initial=engine.steps, desc=config.mechanism.name, unit="step",
               disable=not config.output.progress, file=sys.stderr, dynamic_ncols=True,
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

    folder = config.output.folder
    while engine.steps < total_steps and not engine.budget_exhausted:
        next_boundary = min(next_epoch_end(engine.steps, sample_rate), total_steps)
        train_steps(module, optimizer, batches, engine, next_boundary - engine.steps, loss_fn=loss_fn, on_step=on_step)
        history.epochs.append(EpochRecord(engine.steps * sample_rate, engine.steps,
                                          evaluate_accuracy(module, test_loader), engine.epsilon_by_accountant()))
        bar.write(f"step {engine.steps}: test accuracy {history.epochs[-1].test_accuracy:.4f}, "
                  f"epsilon ({engine.setup.accountant}) {engine.get_epsilon():.4f}", file=sys.stderr)
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
            save_checkpoint(folder / CHECKPOINT_NAME, module=module, optimizer=optimizer, engine=engine,
                            extra={"history": history.to_dict()})
    bar.close()
