"""One private training run from a configuration: :func:`train_private`.

>>> from dpnoise.training import (DataConfig, OptimizerConfig, PrivacyOptions, Schedule, TrainingConfig,
...     train_private)
>>> result = train_private(TrainingConfig(
...     data=DataConfig("digits"),
...     privacy=PrivacyOptions(mechanism="gaussian", delta=1e-5, target_epsilon=2.0, epochs=1),
...     schedule=Schedule(batch_size=64), optimizer=OptimizerConfig(lr=0.05)))  # doctest: +SKIP
>>> result.test_accuracy, result.epsilon_by_accountant                         # doctest: +SKIP

This is what ``dpnoise train`` runs: check the configuration (before any data is loaded), prepare
the data and the model, make them private, train to the planned steps while evaluating (and
checkpointing into the output folder) after every epoch, and summarise.

Under ``torchrun --nproc-per-node K -m dpnoise train ...`` (or in a process group the caller
initialised) every rank runs this function: the ranks sample their shards and sum their noisy
clipped sums (docs/DISTRIBUTED.md), evaluate their shards of the test set and sum the counts; rank 0
alone shows progress, writes the output files and the checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from functools import partial
from typing import TYPE_CHECKING, Optional, Sequence

from dpnoise.formatting import decimals
from dpnoise.training.config import CHECKPOINT_NAME, InvalidConfigError, TrainingConfig, check_config
from dpnoise.training.preparation import (
    apply_dirichlet_learning_rate,
    batch_collation,
    build_optimizer,
    check_against_registries,
    prepare_model_and_data,
    standardize_features,
)
from dpnoise.training.report import StepRecord
from dpnoise.training.summary import TrainingResult, summarize

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from dpnoise.accounting.events import DpEvent
    from dpnoise.training.batches import LossFunction
    from dpnoise.training.engine import PrivacyEngine
    from dpnoise.training.loop import StepMetrics
    from dpnoise.training.report import RunHistory

#: batch size of the test-set evaluation
EVAL_BATCH_SIZE = 1000
#: the progress bar shows the mean loss and batch accuracy of the last this many steps (when they are logged)
PROGRESS_WINDOW = 20
#: the warning of a run that logs the statistics of its private batches (``output.log_private_batch_stats``)
PRIVATE_BATCH_STATS_WARNING = (
    "log_private_batch_stats: each step's training loss, training-batch accuracy and batch size, recorded in "
    "steps.csv, metrics.json, curves.png and the checkpoint and shown on the progress bar, are computed from the "
    "private training batches without noise and are not covered by the epsilon. Leave it off (the default) wherever "
    "these outputs may be seen by someone the training data must be protected from.")


def train_private(config: TrainingConfig) -> TrainingResult:
    """Train ``config.model`` on ``config.data`` with ``config.privacy.mechanism`` and return the result.

    Every field is checked before any work (:class:`~dpnoise.training.config.InvalidConfigError`
    names the field).  With ``config.output.folder``, metrics.json, steps.csv, epochs.csv,
    curves.png and a checkpoint after every epoch are written there; ``config.output.resume``
    continues from such a checkpoint.  Progress goes to stderr; nothing is printed to stdout.
    The outputs and the progress bar hold nothing computed from a private batch unless
    ``config.output.log_private_batch_stats`` (warned: those statistics are not covered by the epsilon).
    """
    check_config(config)
    import torch

    from dpnoise.training.distributed import DistributedError, join_process_group, leave_process_group

    check_against_registries(config)
    device = run_device(config)
    started = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    device, joined = join_process_group(device)
    try:
        return train_on_device(config, device, started)
    except DistributedError as err:
        checkpoint = config.output.folder / CHECKPOINT_NAME if config.output.folder else None
        if checkpoint is None or not checkpoint.is_file():
            raise
        raise type(err)(f"{err}; the last checkpoint, {checkpoint}, is intact: resume from it with the same "
                        f"number of processes") from None
    finally:
        if joined:
            leave_process_group()


def run_device(config: TrainingConfig) -> torch.device:
    """``config.execution.device`` resolved ("auto", and None: the model is built on the CPU, so not its device
    but CUDA when available); an unavailable one names the field."""
    from dpnoise.training.devices import resolve_device
    from dpnoise.training.errors import InvalidTrainingOptionError

    device = config.execution.device
    try:
        return resolve_device("auto" if device is None else device)
    except InvalidTrainingOptionError as err:
        problem = str(err).removeprefix("device ")
        raise InvalidConfigError(lambda n: f"{n('execution.device')} {problem}") from None


def train_on_device(config: TrainingConfig, device: torch.device, started: float) -> TrainingResult:
    """The run of :func:`train_private` once its device (and process group) is set up."""
    import torch
    from torch.utils.data import DataLoader, Subset

    from dpnoise.accounting import UnsoundAccountantWarning
    from dpnoise.errors import DpnoiseError
    from dpnoise.training.averaging import learning_rate_schedule, parameter_average
    from dpnoise.training.checkpoint import checkpoint_key, load_checkpoint
    from dpnoise.training.engine import PrivacyEngine
    from dpnoise.training.report import RunHistory, write_run_outputs
    from dpnoise.training.sampling import shard_indices

    checkpoint_key()  # a short, empty, conflicting or unreadable key setting stops the run here, before any step
    torch.manual_seed(config.seed)
    model, train_set, test_set = prepare_model_and_data(config)
    releases = standardize_features(config, model, train_set)
    optimizer = build_optimizer(config, model)
    # the average is copied from the plain model, before make_private hooks it
    average = parameter_average(model, config.optimizer.ema_decay) if config.optimizer.ema_decay else None
    engine = PrivacyEngine(seed=config.seed, noise_seed=config.noise_seed)
    model.train()  # pretrained models may come in eval mode (Hugging Face's from_pretrained)
    module, optimizer, loader = make_private_from_config(engine, config, model, optimizer,
                                                         DataLoader(train_set, batch_size=config.schedule.batch_size,
                                                                    **batch_collation(train_set)), device, releases)
    apply_dirichlet_learning_rate(config, optimizer, engine)
    total_steps = min(engine.planned_steps, config.schedule.max_steps or engine.planned_steps)
    extras = PostProcessing(model, average.to(engine.device) if average is not None else None,
                            learning_rate_schedule(optimizer, config.optimizer.lr_schedule, engine.planned_steps))
    history = RunHistory()
    if config.output.resume:
        try:
            extra = load_checkpoint(config.output.resume, module=module, optimizer=optimizer, engine=engine,
                                    output_folder=config.output.folder, resume_older=config.output.resume_older)
        except DpnoiseError as err:  # unreadable, tampered or from another setup: name the field
            problem = str(err)
            raise InvalidConfigError(lambda n: f"{n('output.resume')}: {problem}") from err
        history = RunHistory.from_dict(extra["history"], private_batch_stats=config.output.log_private_batch_stats)
        extras.load_state_dict(extra.get("post_processing", {}))
    test_shard = Subset(test_set, shard_indices(len(test_set), engine.rank, engine.world_size).tolist())
    test_loader = DataLoader(test_shard, batch_size=EVAL_BATCH_SIZE, **batch_collation(test_set))
    if config.output.log_private_batch_stats and engine.rank == 0:  # the rank that publishes
        warnings.warn(PRIVATE_BATCH_STATS_WARNING, UserWarning, stacklevel=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)  # stated in the final report
        # Opacus's hooks on the first layer trigger this torch notice on every run; it is harmless.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        run_epochs(config, module, optimizer, loader, test_loader, engine, history, total_steps, extras)
        result = summarize(config, engine, optimizer, history, len(train_set), time.perf_counter() - started)
    if config.output.folder and engine.rank == 0:
        files = write_run_outputs(config.output.folder, result.summary(), history)
        if labels_of(config):
            files.append(config.output.folder / LABELS_NAME)
            files[-1].write_text(json.dumps(labels_of(config), indent=1) + "\n")
        result = dataclasses.replace(result, files=tuple(files))
    return result


#: where a run on a user's own data writes its label names (the class of each output of the model)
LABELS_NAME = "labels.json"


def labels_of(config: TrainingConfig) -> dict[str, list[str]]:
    """``{"labels": [name of class 0, ...]}`` for a data set from a user's files (empty for a packaged one)."""
    from dpnoise.data import label_names

    names = label_names(config.data.name)
    return {} if names is None else {"labels": list(names)}


def make_private_from_config(
    engine: PrivacyEngine, config: TrainingConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
    loader: DataLoader, device: torch.device, releases: tuple[DpEvent, ...] = (),
) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    """The engine's ``make_private`` with the configuration's own options (the one call): its privacy section
    with the training data's ``releases`` made before it and a stop at the budget, its execution section on
    ``device``, and the privacy units of the data's unit column."""
    from dpnoise.accounting import MECHANISMS
    from dpnoise.data import dataset_info, privacy_units_of

    privacy = dataclasses.replace(config.privacy, data_releases=releases, on_budget_exhausted="stop")
    options = privacy.options
    if "num_classes" in MECHANISMS[privacy.mechanism].option_names() and options.num_classes is None:
        # the release's size: exact routes where one applies
        options = dataclasses.replace(options, num_classes=dataset_info(config.data.name).num_classes)
        privacy = dataclasses.replace(privacy, options=options)
    return engine.make_private_with_options(model, optimizer, loader, privacy=privacy,
                                            execution=dataclasses.replace(config.execution, device=device),
                                            loss_fn=training_loss(config), privacy_unit=privacy_units_of(config.data.name))


def training_loss(config: TrainingConfig) -> Optional[LossFunction]:
    """The run's loss ``loss_fn(logits, labels)``: the cross-entropy with the configuration's label smoothing;
    without it None, the model's own loss for dict batches (Hugging Face), the cross-entropy otherwise."""
    from torch.nn import functional as F

    label_smoothing = config.optimizer.label_smoothing
    if not label_smoothing:
        return None
    return partial(F.cross_entropy, label_smoothing=label_smoothing)


class PostProcessing:
    """What is done with the private iterates after each step: the parameter average (evaluated in
    place of the last iterate) and the learning-rate schedule; both in the checkpoints."""

    def __init__(self, model: nn.Module, average: Optional[nn.Module],
                 schedule: Optional[torch.optim.lr_scheduler.LRScheduler]):
        #: the plain model under the private wrapper (its parameters are the iterates)
        self.model = model
        self.average = average
        self.schedule = schedule

    def after_step(self) -> None:
        if self.average is not None:
            self.average.update_parameters(self.model)
        if self.schedule is not None:
            self.schedule.step()

    def evaluated(self, module: nn.Module) -> nn.Module:
        """The model to evaluate: the average if there is one, else ``module``."""
        return module if self.average is None else self.average

    def state_dict(self) -> dict:
        return {name: part.state_dict() for name, part in (("average", self.average), ("schedule", self.schedule))
                if part is not None}

    def load_state_dict(self, state: dict) -> None:
        for name, part in (("average", self.average), ("schedule", self.schedule)):
            if part is not None and name in state:
                part.load_state_dict(state[name])


def next_epoch_end(steps: int, sample_rate: float) -> int:
    """First epoch boundary after ``steps``: epoch k ends at step ceil(k / q), as in the calibration."""
    epoch = math.floor(steps * sample_rate + 1e-9) + 1
    while math.ceil(epoch / sample_rate - 1e-9) <= steps:
        epoch += 1
    return math.ceil(epoch / sample_rate - 1e-9)


def run_epochs(
    config: TrainingConfig, module: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
    test_loader: DataLoader, engine: PrivacyEngine, history: RunHistory, total_steps: int,
    extras: PostProcessing,
) -> None:
    """Train to ``total_steps``, evaluating (and checkpointing into the output folder) after every epoch."""
    from tqdm import tqdm

    from dpnoise.training.checkpoint import save_checkpoint
    from dpnoise.training.loop import endless_batches, train_steps
    from dpnoise.training.report import EpochRecord

    sample_rate = engine.setup.sample_rate
    loss_fn = training_loss(config)
    batches = endless_batches(loader)
    # Redraw rarely when stderr is a log file, not a terminal (keeps logs readable).
    bar = tqdm(total=total_steps, initial=engine.steps, desc=config.privacy.mechanism, unit="step",
               disable=not config.output.progress or engine.rank != 0, file=sys.stderr, dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 15.0)

    def on_step(metrics: StepMetrics) -> None:
        history.steps.append(step_record(metrics, sample_rate, engine.get_quick_epsilon(),
                                         config.output.log_private_batch_stats))
        extras.after_step()
        bar.set_postfix(progress_postfix(history.steps[-PROGRESS_WINDOW:]), refresh=False)
        bar.update(1)

    folder = config.output.folder
    while engine.steps < total_steps and not engine.budget_exhausted:
        next_boundary = min(next_epoch_end(engine.steps, sample_rate), total_steps)
        train_steps(module, optimizer, batches, engine, next_boundary - engine.steps, loss_fn=loss_fn, on_step=on_step)
        history.epochs.append(EpochRecord(engine.steps * sample_rate, engine.steps,
                                          evaluate_test_accuracy(extras.evaluated(module), test_loader, engine),
                                          engine.epsilon_by_accountant()))
        if engine.rank == 0:
            bar.write(f"step {engine.steps}: test accuracy {history.epochs[-1].test_accuracy:.4f}, "
                      f"epsilon ({engine.setup.accountant}) {decimals(engine.get_epsilon(), 4, 'up')}", file=sys.stderr)
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
            save_checkpoint(folder / CHECKPOINT_NAME, module=module, optimizer=optimizer, engine=engine,
                            extra={"history": history.to_dict(), "post_processing": extras.state_dict(),
                                   **labels_of(config)})
    bar.close()


def step_record(metrics: StepMetrics, sample_rate: float, epsilon: float, private_batch_stats: bool) -> StepRecord:
    """The record of a step that spent ``epsilon`` so far; the loss, accuracy and size of its private batch
    only with ``private_batch_stats``."""
    stats = ({"loss": metrics.loss, "batch_accuracy": metrics.batch_accuracy, "batch_size": metrics.batch_size}
             if private_batch_stats else {})
    return StepRecord(metrics.step, metrics.step * sample_rate, epsilon=epsilon, **stats)


def progress_postfix(recent: Sequence[StepRecord]) -> dict[str, str]:
    """What the progress bar shows after the last of the ``recent`` steps: the mean loss and batch accuracy
    over those that hold their private batch's statistics (none unless the run logs them), and the epsilon."""
    logged = [s for s in recent if s.loss is not None]
    postfix = {"loss": f"{sum(s.loss for s in logged) / len(logged):.3f}",
               "acc": f"{sum(s.batch_accuracy for s in logged) / len(logged):.3f}"} if logged else {}
    return {**postfix, "eps": decimals(recent[-1].epsilon, 3, "up")}


def evaluate_test_accuracy(module: nn.Module, test_loader: DataLoader, engine: PrivacyEngine) -> float:
    """Top-1 accuracy on the test set; in a process group each rank counts its shard and the counts are summed."""
    import torch

    from dpnoise.training.loop import count_correct

    counts = torch.tensor(count_correct(module, test_loader), dtype=torch.float64, device=engine.device)
    if engine.group is not None:
        engine.group.all_reduce_sum([counts], "summing the test accuracy")
    return counts[0].item() / counts[1].item()
