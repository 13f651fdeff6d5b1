"""A private ``transformers.Trainer``: the Trainer's loop, arguments, logging, evaluation and saving, with
each optimizer step one accounted step of a dpnoise mechanism.

What changes against ``Trainer`` (everything else is Trainer's own):

* **batches**: the training data are Poisson-sampled by dpnoise's loader at q = B / N, B the expected
  logical batch (``logical_batch_size``, default ``per_device_train_batch_size x
  gradient_accumulation_steps``); each Poisson batch is one optimizer step, taken in physical batches of
  at most ``per_device_train_batch_size`` examples (:class:`LogicalBatches`).  Trainer's own gradient
  accumulation is therefore off: accumulating several Poisson batches into one step would be a step the
  accountants do not describe.  An empty Poisson batch takes the noise-only step.
* **the step**: per-example clipping to ``privacy.max_grad_norm`` and the mechanism's noise
  (:meth:`~dpnoise.training.PrivacyEngine.make_private_with_options`, run when training starts); Trainer's
  own clipping of the averaged gradient is off (``max_grad_norm`` other than its default is refused).
* **the loss**: the mean over the physical batch of per-example losses: the model's ``outputs.loss`` for a
  classifier, the per-sequence loss for a causal language model (:func:`~dpnoise.training.causal_lm_loss`;
  Hugging Face's is the mean over the batch's tokens, which mixes the examples), or ``loss_fn``.
* **epsilon** (the primary accountant's, cheap at every log: ``get_quick_epsilon``) is in every log,
  hence Trainer's progress bar and ``trainer_state.json``, and the privacy guarantee in the model card;
  the budget stops training through Trainer's control flow (``should_training_stop``).
* **checkpoints** hold the privacy ledger (``dpnoise-checkpoint.pt``, :func:`~dpnoise.training.save_checkpoint`:
  hashed or keyed, the run's step record kept in ``output_dir``); ``train(resume_from_checkpoint=...)``
  checks and restores it as ``dpnoise train --resume`` does, and resumes with fresh Poisson draws.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from pathlib import Path
from collections.abc import Hashable, Sequence
from typing import Any, Iterator, Mapping, Optional, Union

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainingArguments

from dpnoise.training import (
    ExecutionOptions,
    PrivacyEngine,
    PrivacyOptions,
    causal_lm_loss,
    load_checkpoint,
    save_checkpoint,
)
from dpnoise.training.batches import LossFunction
from dpnoise.training.checkpoint import checkpoint_key
from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.batches import is_hugging_face_causal_lm
from dpnoise.training.run_record import record_steps
from dpnoise.training.sampling import LogicalBatchTracker

#: what ``privacy_unit`` takes: one key per training example, or the name of the training dataset's column of keys
PrivacyUnitKeys = Optional[Union[str, Sequence[Hashable]]]


#: the privacy ledger's file in each of Trainer's checkpoint folders
CHECKPOINT_NAME = "dpnoise-checkpoint.pt"
#: what Trainer logs that is computed from the private batches without noise, left out of the logs unless
#: ``log_private_batch_stats`` (the epsilon does not cover them)
PRIVATE_BATCH_STATISTICS = ("loss", "train_loss", "grad_norm", "num_input_tokens_seen", "train_tokens_per_second")
#: Trainer's default ``max_grad_norm``, which the private Trainer switches off (any other value is refused)
TRAINER_DEFAULT_MAX_GRAD_NORM = 1.0


class LogicalBatch(list):
    """The physical batches of one Poisson draw, in order: one optimizer step."""


class LogicalBatches:
    """The private loader's physical batches grouped by Poisson draw (one :class:`LogicalBatch` per
    accounted step); its length is the loader's number of draws per pass."""

    def __init__(self, loader: DataLoader, tracker: LogicalBatchTracker) -> None:
        self.loader, self.tracker = loader, tracker

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[LogicalBatch]:
        pieces = LogicalBatch()
        for batch in self.loader:
            pieces.append(batch)
            drawn = self.tracker.last
            if drawn.piece == drawn.pieces - 1:
                yield pieces
                pieces = LogicalBatch()


def examples_in(batch: Any) -> int:
    """The number of examples in a physical batch (a dict of tensors or a sequence of them)."""
    values = batch.values() if isinstance(batch, dict) else batch
    return int(next(v for v in values if isinstance(v, torch.Tensor)).shape[0])


class PrivateTrainingMixin:
    """What makes a ``transformers.Trainer`` (or a subclass of it, TRL's ``SFTTrainer``) private: mixed in
    before it (``class PrivateTrainer(PrivateTrainingMixin, Trainer)``); its arguments are
    :class:`PrivateTrainer`'s."""

    def __init__(self, model: torch.nn.Module, args: TrainingArguments, *, privacy: PrivacyOptions | Mapping[str, Any],
                 execution: ExecutionOptions = ExecutionOptions(), logical_batch_size: Optional[int] = None,
                 loss_fn: Optional[LossFunction] = None, seed: Optional[int] = None, noise_seed: Optional[int] = None,
                 log_private_batch_stats: bool = False, privacy_unit: PrivacyUnitKeys = None,
                 **trainer_arguments: Any) -> None:
        self._init_private(model, args, privacy=privacy, execution=execution, logical_batch_size=logical_batch_size,
                           loss_fn=loss_fn, seed=seed, noise_seed=noise_seed,
                           log_private_batch_stats=log_private_batch_stats, privacy_unit=privacy_unit,
                           **trainer_arguments)

    def _init_private(self, model: torch.nn.Module, args: TrainingArguments, *,
                      privacy: PrivacyOptions | Mapping[str, Any], execution: ExecutionOptions,
                      logical_batch_size: Optional[int], loss_fn: Optional[LossFunction], seed: Optional[int],
                      noise_seed: Optional[int], log_private_batch_stats: bool, privacy_unit: PrivacyUnitKeys = None,
                      **trainer_arguments: Any) -> None:
        if args.max_grad_norm not in (0, TRAINER_DEFAULT_MAX_GRAD_NORM):
            raise InvalidTrainingOptionError(
                f"TrainingArguments.max_grad_norm={args.max_grad_norm} would clip the noisy average gradient; the "
                f"private Trainer clips each example's gradient to the privacy options' max_grad_norm instead: leave "
                f"TrainingArguments.max_grad_norm at its default")
        for option in ("packing", "padding_free"):  # TRL's SFTConfig: examples joined into one row
            if getattr(args, option, False):
                raise InvalidTrainingOptionError(f"{type(args).__name__}.{option} joins several examples into one row, "
                                                 f"whose gradient is then no example's own: set {option}=False")
        for option in ("fp16", "torch_compile"):
            if getattr(args, option, False):
                raise InvalidTrainingOptionError(f"TrainingArguments.{option} is not supported by the private "
                                                 f"Trainer (bf16 is)")
        self.physical_batch_size = args.per_device_train_batch_size
        self.logical_batch_size = logical_batch_size or args.per_device_train_batch_size * args.gradient_accumulation_steps
        if self.logical_batch_size < 1:
            raise InvalidTrainingOptionError(f"logical_batch_size must be >= 1, got {self.logical_batch_size}")
        args = dataclasses.replace(args, gradient_accumulation_steps=1, max_grad_norm=0.0)
        #: each training example's privacy unit (None: each example is its own)
        self.privacy_unit_keys = _unit_keys(privacy_unit, trainer_arguments.get("train_dataset"))
        if not isinstance(privacy, PrivacyOptions):
            privacy = PrivacyOptions(**{"epochs": self._planned_epochs(args, trainer_arguments.get("train_dataset")),
                                        **privacy})
        super().__init__(model=model, args=args, **trainer_arguments)
        self.privacy = dataclasses.replace(privacy, on_budget_exhausted="stop")
        self.execution = execution
        self.log_private_batch_stats = log_private_batch_stats
        if log_private_batch_stats:
            warnings.warn("log_private_batch_stats: Trainer's training loss (and tokens seen) are computed from the "
                          "private batches without noise and are not covered by the epsilon; leave it off wherever the "
                          "logs may be seen by someone the training data must be protected from", stacklevel=2)
        self.loss_fn = loss_fn if loss_fn is not None else (causal_lm_loss if is_hugging_face_causal_lm(model) else None)
        self.privacy_engine = PrivacyEngine(seed=args.seed if seed is None else seed, noise_seed=noise_seed)
        self.add_callback(PrivacyCallback(self))
        self._private_loader: Optional[DataLoader] = None
        #: the private optimizer (Trainer's ``self.optimizer`` is it, or accelerate's wrapper of it)
        self.private_optimizer: Optional[torch.optim.Optimizer] = None
        self._resume_from: Optional[str] = None

    def _planned_epochs(self, args: TrainingArguments, dataset: Any) -> Optional[float]:
        """The epochs the noise is calibrated for: ``args.max_steps`` Poisson batches of B out of the N
        training examples where it is set, else ``args.num_train_epochs``."""
        if args.max_steps > 0 and dataset is not None:
            population = len(dataset) if self.privacy_unit_keys is None else len(set(self.privacy_unit_keys))
            return args.max_steps * self.logical_batch_size / population
        return float(args.num_train_epochs)

    # ------------------------------------------------------------------------------------ setting up
    def train(self, resume_from_checkpoint: Optional[str | bool] = None, **arguments: Any):
        """Trainer's ``train``; with ``resume_from_checkpoint`` the privacy ledger of that checkpoint is
        checked and restored too (refused if it is not this run's, as ``dpnoise train --resume``)."""
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resume_from = resume_from_checkpoint or None
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **arguments)

    def get_train_dataloader(self) -> LogicalBatches:
        """The Poisson loader's logical batches; the first call makes the model, optimizer and loader private."""
        if self._private_loader is None:
            self._make_private()
        return LogicalBatches(self._private_loader, self.privacy_engine.logical_batches)

    def _make_private(self) -> None:
        dataset = self.train_dataset
        if self.args.remove_unused_columns and hasattr(dataset, "column_names"):  # a datasets.Dataset
            dataset = self._remove_unused_columns(dataset, description="training")
        collator = self._get_collator_with_removed_columns(self.data_collator, description="training")
        loader = DataLoader(dataset, batch_size=self.logical_batch_size, collate_fn=collator,
                            num_workers=self.args.dataloader_num_workers)
        if self.optimizer is None:
            self.create_optimizer()
        physical = self.physical_batch_size if self.physical_batch_size < self.logical_batch_size else None
        execution = self.execution if self.execution.max_physical_batch_size is not None else dataclasses.replace(
            self.execution, max_physical_batch_size=physical)
        module, optimizer, private_loader = self.privacy_engine.make_private_with_options(
            self.model, self.optimizer, loader, privacy=self.privacy, execution=execution, loss_fn=self.loss_fn,
            privacy_unit=self.privacy_unit_keys)
        self.optimizer, self.model_wrapped, self._private_loader = optimizer, module, private_loader
        self.private_optimizer = optimizer
        if self._resume_from is not None:
            load_checkpoint(Path(self._resume_from) / CHECKPOINT_NAME, module=module, optimizer=optimizer,
                            engine=self.privacy_engine, output_folder=self.args.output_dir)

    def get_resumed_dataloader(self, dataloader: LogicalBatches, num_batches: int) -> LogicalBatches:
        """A resumed run draws new Poisson batches (the ledger holds the steps taken): nothing is skipped."""
        return dataloader

    # ------------------------------------------------------------------------------------ the step
    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any = None):
        return list(itertools.islice(epoch_iterator, num_batches)), None

    def training_step(self, model: torch.nn.Module, inputs: LogicalBatch, num_items_in_batch: Any = None) -> torch.Tensor:
        """Forward and backward each physical batch of the logical batch ``inputs``; the private optimizer
        clips and accumulates after each one but the last, whose step Trainer takes (noise and update)."""
        model.train()
        total, examples = torch.zeros((), device=self.args.device), 0
        for index, piece in enumerate(inputs):
            count = examples_in(piece)
            if count:  # an empty batch: Hugging Face models cannot run on zero examples; the step adds the noise
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(model, piece)
                self.accelerator.backward(loss)
                total, examples = total + loss.detach() * count, examples + count
            if index < len(inputs) - 1:
                self.private_optimizer.step()
                model.zero_grad()
        return total / max(examples, 1)

    def compute_loss(self, model: torch.nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: Any = None):
        """The mean over the batch of per-example losses (module docstring); Trainer's ``num_items_in_batch``
        (a token count over the whole accumulated batch) is not used: it would mix the examples."""
        if self.loss_fn is None:
            outputs = model(**inputs)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
        else:
            labels = inputs["labels"]
            outputs = model(**{name: value for name, value in inputs.items() if name != "labels"})
            loss = self.loss_fn(outputs["logits"] if isinstance(outputs, dict) else outputs[0], labels)
        return (loss, outputs) if return_outputs else loss

    def floating_point_ops(self, inputs: Any) -> int:
        count = super().floating_point_ops  # (a bare super() cannot be called inside the generator)
        if isinstance(inputs, LogicalBatch):
            return sum(count(piece) for piece in inputs if examples_in(piece))
        return count(inputs)

    def _track_num_input_tokens(self, inputs: Any) -> None:
        for piece in inputs if isinstance(inputs, LogicalBatch) else [inputs]:
            super()._track_num_input_tokens(piece)

    # ------------------------------------------------------------------------------------ reporting
    def log(self, logs: dict[str, float], *arguments: Any, **keywords: Any) -> None:
        """Trainer's logs with the privacy spent so far (``epsilon`` under the primary accountant, ``delta``,
        ``private_steps``), without what Trainer computes from the private batches without noise
        (:data:`PRIVATE_BATCH_STATISTICS`) unless ``log_private_batch_stats``."""
        if not self.log_private_batch_stats:
            logs = {name: value for name, value in logs.items() if name not in PRIVATE_BATCH_STATISTICS}
        if self.privacy_engine.setup is not None:
            logs = {**logs, "epsilon": self.privacy_engine.get_epsilon(), "delta": self.privacy_engine.setup.delta,
                    "private_steps": self.privacy_engine.steps}
        super().log(logs, *arguments, **keywords)

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> None:
        """None: the norm of the gradient before noise is a statistic of the private batch (never logged)."""
        return None

    def privacy_statement(self) -> str:
        """One paragraph for the model card: the mechanism, the guarantee and what it covers."""
        engine = self.privacy_engine
        if engine.setup is None:
            return "Trained privately with dpnoise (training has not started)."
        setup = engine.setup
        statement = (f"Trained with differential privacy by dpnoise: mechanism {setup.mechanism}, noise {setup.noise:.6g}, "
                     f"per-example clipping norm {setup.clip:g}, Poisson sampling at q = {setup.sample_rate:.6g}, "
                     f"{engine.steps} steps: ({engine.get_epsilon():.4f}, {setup.delta:g})-DP under the "
                     f"{setup.accountant} accountant, for " + ("the training examples." if setup.privacy_units is None
                                                               else f"each of the {setup.privacy_units} privacy units, "
                                                                    f"all its examples together."))
        return statement + ("" if engine.scope_statement is None else " " + engine.scope_statement)

    def create_model_card(self, *arguments: Any, **keywords: Any) -> None:
        """Trainer's model card with the privacy guarantee (:meth:`privacy_statement`) appended."""
        super().create_model_card(*arguments, **keywords)
        card = Path(self.args.output_dir) / "README.md"
        if self.is_world_process_zero() and card.is_file():
            card.write_text(card.read_text() + "\n## Differential privacy\n\n" + self.privacy_statement() + "\n")

    # ------------------------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        engine = self.privacy_engine
        save_checkpoint(folder / CHECKPOINT_NAME, module=self.model_wrapped, optimizer=self.private_optimizer,
                        engine=engine)
        if engine.rank == 0:  # the run's step count where its later checkpoints are written, against rollbacks
            record_steps(Path(self.args.output_dir), engine.run_id, engine.steps, dataclasses.asdict(engine.setup),
                         checkpoint_key())


def _unit_keys(privacy_unit: PrivacyUnitKeys, dataset: Any) -> Optional[Sequence[Hashable]]:
    """The training examples' unit keys: ``privacy_unit`` itself, or the dataset's column it names."""
    if not isinstance(privacy_unit, str):
        return privacy_unit
    if not hasattr(dataset, "column_names") or privacy_unit not in dataset.column_names:
        raise InvalidTrainingOptionError(f"privacy_unit {privacy_unit!r} names no column of the training dataset "
                                         f"(a datasets.Dataset's column of unit keys, or give the keys themselves)")
    return dataset[privacy_unit]


class PrivateTrainer(PrivateTrainingMixin, Trainer):
    """``transformers.Trainer`` whose every optimizer step is a private step (module docstring).

    ``privacy``: what is released, a :class:`~dpnoise.training.PrivacyOptions` or a mapping of its fields whose
    ``epochs`` default to the training's (``args.max_steps`` steps, else ``args.num_train_epochs``): the noise
    is calibrated for them; a step past the budget stops training;
    ``execution``: how (:class:`~dpnoise.training.ExecutionOptions`; its ``max_physical_batch_size`` is
    ``per_device_train_batch_size``); ``logical_batch_size``: the expected Poisson batch B; ``loss_fn``:
    ``loss_fn(logits, labels)``, the mean of per-example losses (default above); ``seed`` /
    ``noise_seed``: the engine's (:class:`~dpnoise.training.PrivacyEngine`; default ``args.seed`` and
    secret); ``log_private_batch_stats``: keep Trainer's training loss in the logs (warned: it is computed
    from the private batches without noise); ``privacy_unit``: the unit the epsilon protects whole, one key per
    training example or the name of the training dataset's column of keys (a user or document id;
    :mod:`dpnoise.training.privacy_units`: ``logical_batch_size`` is then the expected number of units per batch,
    and ``per_device_train_batch_size`` must hold a whole batch).  Every other argument is Trainer's.  The engine is :attr:`privacy_engine`; ``self.model``
    stays the model as given (what ``save_model``, ``evaluate`` and ``generate`` use), the private module
    is ``self.model_wrapped`` once training has started.
    """


class PrivacyCallback(TrainerCallback):
    """Stops training once a step was refused for the budget (``on_budget_exhausted="stop"``)."""

    def __init__(self, trainer: PrivateTrainingMixin) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **keywords):
        if self.trainer.privacy_engine.budget_exhausted:
            control.should_training_stop = True
        return control
