"""Errors raised by the experiment runner (all derive from :class:`~dpnoise.errors.DpnoiseError`)."""

from dpnoise.errors import DpnoiseError


class PlanMismatchError(DpnoiseError, RuntimeError):
    """A finished run does not match its plan (e.g. ``dpnoise train`` planned other steps)."""
