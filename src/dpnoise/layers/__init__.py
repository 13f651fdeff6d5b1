"""Drop-in layers that book-keeping covers exactly, and :func:`fix_model`, which swaps them into a model.

``nn.MultiheadAttention``, ``nn.RNN``, ``nn.LSTM`` and ``nn.GRU`` compute their linear maps inside fused
kernels that no per-layer rule sees; :class:`MultiheadAttention`, :class:`RNN`, :class:`LSTM` and
:class:`GRU` compute the same functions with ``nn.Linear`` maps and take the originals' weights
(``from_module``).  BatchNorm mixes the examples of a batch and has no private equivalent; ``fix_model``
replaces it by a GroupNorm.

:class:`Scale`, :class:`Shift`, :class:`ClsToken` and :class:`PositionEmbedding` hold what models usually keep as
bare parameters of a larger module (layer scales, gates, ViT's CLS token and position embeddings) as layers whose
per-example gradients book-keeping computes directly, instead of re-running the larger module per example.
"""

from dpnoise.layers.attention import MultiheadAttention
from dpnoise.layers.elementwise import ClsToken, PositionEmbedding, Scale, Shift
from dpnoise.layers.errors import LayerInputError, UnsupportedLayerError
from dpnoise.layers.recurrent import GRU, LSTM, RNN, RecurrentCell, RecurrentLayer
from dpnoise.layers.replacement import EQUIVALENTS, fix_model, group_norm_for

__all__ = ["ClsToken", "EQUIVALENTS", "GRU", "LSTM", "LayerInputError", "MultiheadAttention", "PositionEmbedding", "RNN",
           "RecurrentCell", "RecurrentLayer", "Scale", "Shift", "UnsupportedLayerError", "fix_model", "group_norm_for"]
