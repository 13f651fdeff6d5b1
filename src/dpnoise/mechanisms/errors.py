"""Errors raised by the mechanisms (all derive from :class:`~dpnoise.errors.DpnoiseError`)."""

from dpnoise.errors import DpnoiseError


class InvalidMechanismError(DpnoiseError, ValueError):
    """An unknown or ill-formed mechanism, or a model the mechanism cannot wrap."""
