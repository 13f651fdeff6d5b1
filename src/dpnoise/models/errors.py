"""Errors raised by the model zoo."""

from __future__ import annotations

from dpnoise.errors import DpnoiseError


class ModelNotAvailableError(DpnoiseError, FileNotFoundError):
    """Pretrained weights are not installed; ``install`` is the exact command that installs them."""

    def __init__(self, model: str, missing: str, install: str) -> None:
        self.model = model
        self.missing = missing
        self.install = install
        super().__init__(f"model {model!r} is not available: {missing} not found. To install it: {install}")

    def __reduce__(self):  # picklable across the experiment runner's worker processes
        return (type(self), (self.model, self.missing, self.install))


class InvalidModelError(DpnoiseError, ValueError):
    """A model name or option is invalid, or weights do not fit the model."""
