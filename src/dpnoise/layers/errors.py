"""The layers' errors."""

from dpnoise.errors import DpnoiseError


class UnsupportedLayerError(DpnoiseError, ValueError):
    """A layer (or a configuration of one) that :mod:`dpnoise.layers` cannot replace exactly."""
