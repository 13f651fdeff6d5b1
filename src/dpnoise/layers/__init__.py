"""Drop-in layers that book-keeping covers exactly, and :func:`fix_model`, which swaps them into a model.

``nn.MultiheadAttention``, ``nn.RNN``, ``nn.LSTM`` and ``nn.GRU`` compute their linear maps inside fused
kernels that no per-layer rule sees; :class:`MultiheadAttention`, :class:`RNN`, :class:`LSTM` and
:class:`GRU` compute the same functions with ``nn.Linear`` maps and take the originals' weights
(``from_module``).  BatchNorm mixes the examples of a batch and has no private equivalent; ``fix_model``
replaces it by a GroupNorm.
"""

from dpnoise.layers.attention import MultiheadAttention
from dpnoise.layers.errors import UnsupportedLayerError
from dpnoise.layers.recurrent import GRU, LSTM, RNN, RecurrentCell, RecurrentLayer
from dpnoise.layers.replacement import EQUIVALENTS, fix_model, group_norm_for

__all__ = ["EQUIVALENTS", "GRU", "LSTM", "MultiheadAttention", "RNN", "RecurrentCell", "RecurrentLayer",
           "UnsupportedLayerError", "fix_model", "group_norm_for"]
