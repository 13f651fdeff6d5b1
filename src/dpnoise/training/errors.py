"""Errors raised by the private training engine (all derive from :class:`~dpnoise.errors.DpnoiseError`), and
its warnings."""

from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.errors import DpnoiseError


class PrivacyBudgetExceededError(DpnoiseError, RuntimeError):
    """An optimizer step would push the epsilon of the primary accountant past the target."""


class UnsupportedLayerError(DpnoiseError, ValueError):
    """The model contains a layer that breaks per-example privacy (named in the message)."""


class CheckpointMismatchError(DpnoiseError, ValueError):
    """A checkpoint was saved under a different privacy configuration than the one resuming it,
    or its accountants, step counter or budget flag do not agree with each other (one line names
    the field that differs)."""


class CheckpointError(DpnoiseError, ValueError):
    """A checkpoint file cannot be read (missing, empty, not a checkpoint, truncated, corrupted,
    an older format); the message names the path and the problem."""


class UnkeyedCheckpointWarning(UserWarning):
    """A checkpoint is written without a key: its hash detects corruption, not deliberate edits made
    consistently (with its run record); shown once per run (:mod:`dpnoise.training.checkpoint`)."""


class InvalidTrainingOptionError(InvalidParameterError):
    """An option of ``make_private`` or of the private optimizer is invalid (the message names it)."""


class EngineStateError(DpnoiseError, RuntimeError):
    """The engine was used out of order (e.g. ``make_private`` called twice on one engine)."""


class PerExampleCheckError(DpnoiseError, ValueError):
    """The engine's per-example gradients of a model and loss are not each example's own gradient (or
    depend on other examples of the batch), so the epsilon reported would not hold; the message names
    the parameter, the error and the likely cause (:mod:`dpnoise.training.per_example_check`)."""


class CheckpointKeyError(CheckpointError):
    """The checkpoint key is unusable (too short, unreadable key file)."""


class ForeignBatchError(DpnoiseError, RuntimeError):
    """An optimizer step would release gradients that do not come from one Poisson draw of the private
    loader (another loader's batch, a repeated or re-dealt draw, several forward passes): refused before
    any noise or accounting (the message names what happened and the fix)."""


class GradientSourceWarning(UserWarning):
    """``grad_sample_mode="auto"`` takes every per-example gradient from Opacus's hooks because book-keeping
    does not support some layers (the message names each one and why; ``PrivacyEngine.gradient_sources``
    gives each layer's source)."""


class UncheckedPerExampleGradientsWarning(UserWarning):
    """``per_example_check=False``: nothing checks that each example's clipped gradient is its own (a model or a
    loss that mixes the examples would break the epsilon without a word)."""
