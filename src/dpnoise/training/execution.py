"""How a private run executes, apart from what it releases (torch-free): Poisson sampling, the source
of per-example gradients, the device, physical batches and, in a process group, who adds the noise.

:class:`ExecutionOptions` is frozen, keyword-only and checked when built (every error names its
option); with :class:`~dpnoise.training.privacy_plan.PrivacyOptions` it is what
:meth:`~dpnoise.training.engine.PrivacyEngine.make_private_with_options` takes, and the ``execution``
section of a :class:`~dpnoise.training.config.TrainingConfig`: its fields declare their command-line flags
(:func:`~dpnoise.training.options.option`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from dpnoise.accounting.validation import check_count
from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.options import OPTIMISATION, PRIVACY, RUN, option

GradSampleMode = Literal["auto", "bookkeeping", "hooks"]
GRAD_SAMPLE_MODES: tuple[str, ...] = ("auto", "bookkeeping", "hooks")
#: who adds the noise in a process group: every rank a share, or rank 0 all of it (docs/DISTRIBUTED.md)
NOISE_SHARES: tuple[str, ...] = ("split", "rank0")
#: devices a run can be given by name ("auto": CUDA when torch sees a GPU, else the CPU)
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_grad_sample_mode(grad_sample_mode: Any) -> None:
    """Refuse a ``grad_sample_mode`` that is not one of :data:`GRAD_SAMPLE_MODES`."""
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise InvalidTrainingOptionError(
            f"grad_sample_mode must be one of {', '.join(GRAD_SAMPLE_MODES)}, got {grad_sample_mode!r}")


@dataclass(frozen=True, kw_only=True)
class ExecutionOptions:
    """The execution options of ``make_private`` (same names and meaning), checked when built.

    Attributes:
        poisson_sampling: True (default) builds Opacus's Poisson ``DPDataLoader``; False keeps
            shuffled fixed-size batches, which the accountants do NOT cover (warned).
        grad_sample_mode: how gradient mechanisms get per-example gradients: ``"hooks"``
            (Opacus's ``GradSampleModule``, every layer materialised), ``"bookkeeping"``
            (:class:`~dpnoise.training.bookkeeping.BookkeepingModule`: dense layers clipped
            without materialising; same clipped sums, faster) or ``"auto"`` (default:
            bookkeeping when every trainable layer supports it, else hooks).
        device: where the model, batches, clipping, noise and sampler live: "cpu", "cuda" (or
            "cuda:i"), or "auto" (CUDA when available); default: the module's device.  The
            model is moved there; floating-point batches are cast to the model's dtype.
        noise_shares: in a process group of K > 1 ranks (every rank calls ``make_private`` with
            the whole data set and the same options), who adds the noise: ``"split"`` (default:
            every rank adds one of K independent shares, so that no rank draws the total noise)
            or ``"rank0"`` (rank 0 adds all of it); docs/DISTRIBUTED.md says what either hides
            from the ranks (they are trusted, as one process is).  The optimizer and the model must then be
            used on every rank in step; ``save_checkpoint`` too.  Ignored in one process.
        max_physical_batch_size: logical batches larger than memory allows: the loader yields
            each Poisson batch (one accounted step) in physical batches of at most this many
            examples; ``optimizer.step()`` after a physical batch that does not end its logical
            batch only clips and accumulates (no noise, no update, no accounting), and after
            the last one it noises the whole clipped sum once and takes the step.  The usual
            loop (``zero_grad``, forward, ``backward``, ``step`` per batch) needs no change.
            Default: one physical batch per logical batch.
        per_example_check: gradient mechanisms: at the first physical batch of at least 2 examples (in a
            process group, at every rank's first physical batch, the ranks agreeing), before any noise,
            the engine's per-example gradients of a few examples are compared with one-example-at-a-time
            autograd of ``loss_fn``, and shown unchanged when another example of the batch is replaced (:func:`~dpnoise.training.verify_per_example_gradients`, dropout off for the
            check); a mismatch raises :class:`~dpnoise.training.PerExampleCheckError` naming the parameter,
            and every later step repeats the check.  Its report is ``per_example_report``.  False skips it
            (warned).

    In a training run (:func:`~dpnoise.training.train_private`), which builds its model on the CPU, a
    ``device`` of None is "auto".
    """

    grad_sample_mode: GradSampleMode = option(
        "auto", flag="--grad-sample-mode", group=PRIVACY, choices=GRAD_SAMPLE_MODES,
        help="per-example gradients of gradient mechanisms: 'hooks' (Opacus, every layer materialised), "
        "'bookkeeping' (dense layers clipped without materialising; same clipped sums, faster) or 'auto' (default: "
        "bookkeeping where every layer supports it)")
    noise_shares: str = option("split", flag="--noise-shares", group=RUN, choices=NOISE_SHARES,
                               help="under torchrun: split (default; every process adds one of K independent noise "
                               "shares) or rank0 (rank 0 adds all the noise); docs/DISTRIBUTED.md")
    #: under ``torchrun``, "cuda" is each rank's ``cuda:LOCAL_RANK``
    device: Optional[Any] = option(None, flag="--device", group=RUN, choices=DEVICE_CHOICES, type=str,
                                   help="where the model, batches, clipping, noise and sampler live: auto (default): "
                                   "cuda when available, else cpu")
    #: None: one physical batch
    max_physical_batch_size: Optional[int] = option(
        None, flag="--physical-batch-size", group=OPTIMISATION, check=("check_count", 1),
        help="process each Poisson batch in pieces of at most this many examples: their clipped gradients are summed "
        "and noised once, the same step in less memory (default: one piece)")
    poisson_sampling: bool = True
    #: gradient mechanisms in one process: the first batch's per-example gradients checked before any noise
    per_example_check: bool = option(
        True, flag="--no-per-example-check", group=PRIVACY,
        help="skip the check, before the first noised step, that the engine's per-example gradients of a few "
        "examples of the first batch equal one-example-at-a-time autograd and do not change when another example is "
        "replaced (about one extra step; warned: nothing then catches a model or loss that mixes the examples)")

    def __post_init__(self) -> None:
        if not isinstance(self.poisson_sampling, bool):
            raise InvalidTrainingOptionError(f"poisson_sampling must be True or False, got {self.poisson_sampling!r}")
        check_grad_sample_mode(self.grad_sample_mode)
        if not isinstance(self.per_example_check, bool):
            raise InvalidTrainingOptionError(f"per_example_check must be True or False, got {self.per_example_check!r}")
        if self.max_physical_batch_size is not None:
            object.__setattr__(self, "max_physical_batch_size",
                               check_count("max_physical_batch_size", self.max_physical_batch_size, 1))
            if not self.poisson_sampling:
                raise InvalidTrainingOptionError("max_physical_batch_size splits Poisson batches; it needs "
                                                 "poisson_sampling=True")
        if self.noise_shares not in NOISE_SHARES:
            raise InvalidTrainingOptionError(
                f"noise_shares must be one of {', '.join(NOISE_SHARES)}, got {self.noise_shares!r}")
