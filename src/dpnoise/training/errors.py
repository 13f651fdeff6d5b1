"""Errors raised by the private training engine."""


class PrivacyBudgetExceededError(RuntimeError):
    """An optimizer step would push the epsilon of the primary accountant past the target."""


class UnsupportedLayerError(ValueError):
    """The model contains a layer that breaks per-example privacy (named in the message)."""


class CheckpointMismatchError(ValueError):
    """A checkpoint was saved under a different privacy configuration than the one resuming it."""
