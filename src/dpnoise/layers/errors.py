"""The layers' errors."""

from dpnoise.errors import DpnoiseError


class UnsupportedLayerError(DpnoiseError, ValueError):
    """A layer (or a configuration of one) that :mod:`dpnoise.layers` cannot replace exactly."""


class LayerInputError(DpnoiseError, ValueError):
    """An input that a :mod:`dpnoise.layers` layer does not take (e.g. of the wrong shape)."""
