"""Book-keeping sources of library modules that hold bare parameters: their calls run as they are, and the
gradient flowing into one of their sub-modules, captured in the backward pass, gives their per-example gradients.

A module of the model's own that holds bare ``nn.Parameter`` s (ViT's CLS token and position embeddings) could
use them in any way, so book-keeping re-runs it alone per example by ``torch.func``
(:mod:`dpnoise.training.layer_functorch`): exact, but the re-run repeats its sub-layers' work per example (ViT's
patch convolution), and is refused when the module applies dropout.  A module class of a library whose forward is
known can do better.  Hugging Face's ``ViTEmbeddings`` computes

    dropout(cat([cls_token, patches(x)]) + position_embeddings)

so that example i's gradient of ``position_embeddings`` is the gradient ``G_i`` at the dropout's input (its mask
included) and that of ``cls_token`` is ``G_i[0]``.  Book-keeping lets such a call run unchanged (the patch
convolution keeps its own recorded source), captures the gradient at the input of the sub-module the source names
(the *capture point*), and reads the per-example gradients off it.

Sources are registered by the qualified name of the class (its package need not be imported), in the idiom of
:func:`~dpnoise.training.bookkeeping_rules.register_bookkeeping_rule`::

    @register_captured_source("transformers.models.vit.modeling_vit.ViTEmbeddings")
    class VitEmbeddingsSource(CapturedSource): ...

A source applies only where the layer has the structure its formula relies on (:meth:`CapturedSource.applies`),
and serves only the calls the formula holds for (:meth:`CapturedSource.serves`); book-keeping re-runs the other
calls per example by ``torch.func`` (exact, or refused), never reading a gradient the formula does not give.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import nn

from dpnoise.training.errors import UnsupportedLayerError
from dpnoise.training.per_example_gradients import Contribution, MaterialisedGradients, compute_dtype
from dpnoise.training.sharding import layer_type

#: how :func:`~dpnoise.training.bookkeeping.gradient_sources` names the source of a layer with a captured source
CAPTURED_GRADIENT = "book-keeping, captured gradient"


class CapturedSource:
    """How book-keeping gets one layer class's per-example gradients from the gradient at a capture point."""

    def applies(self, layer: nn.Module) -> bool:
        """Whether ``layer`` has the structure the source relies on (where it does not, the layer is re-run per
        example by ``torch.func``)."""
        raise NotImplementedError

    def capture_point(self, layer: nn.Module) -> nn.Module:
        """The sub-module of ``layer`` whose first input's gradient is captured; it must run exactly once in each
        call the source serves."""
        raise NotImplementedError

    def serves(self, layer: nn.Module, args: tuple, kwargs: dict) -> bool:
        """Whether the per-example gradients of the call ``layer(*args, **kwargs)`` follow from the captured
        gradient (otherwise that call is re-run per example by ``torch.func``)."""
        raise NotImplementedError

    def gradients(self, layer: nn.Module, captured_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        """Per-example gradients of ``layer``'s parameters from the gradient at the capture point's input."""
        raise NotImplementedError


#: the qualified name ``"package.module.Class"`` of a layer class -> its captured source
CAPTURED_SOURCES: dict[str, CapturedSource] = {}


def register_captured_source(*qualified_names: str) -> Callable[[type], type]:
    """Class decorator: an instance of the decorated :class:`CapturedSource` serves the layer classes of
    ``qualified_names`` (exact classes, not their subclasses, whose forward may differ)."""

    def register(source_class: type) -> type:
        source = source_class()
        for name in qualified_names:
            CAPTURED_SOURCES[name] = source
        return source_class

    return register


def captured_source(layer: nn.Module) -> Optional[CapturedSource]:
    """The source registered for ``layer``'s class that applies to it (None: none); a layer given to
    ``fully_shard`` takes its own class's (:func:`~dpnoise.training.sharding.layer_type`)."""
    own_type = layer_type(layer)
    source = CAPTURED_SOURCES.get(f"{own_type.__module__}.{own_type.__qualname__}")
    return source if source is not None and source.applies(layer) else None


@register_captured_source("transformers.models.vit.modeling_vit.ViTEmbeddings")
class VitEmbeddingsSource(CapturedSource):
    """Hugging Face's ``ViTEmbeddings``: ``dropout(cat([cls_token, patches(x)]) + position_embeddings)``.

    Captured: the gradient ``G`` at the input of ``dropout`` (an ``nn.Dropout``), ``(B, T + 1, d)``.  Per example,
    ``dL_i/d position_embeddings = G_i`` and ``dL_i/d cls_token = G_i[0]`` (the parameters' shapes ``(1, T + 1, d)``
    and ``(1, 1, d)``); ``mask_token`` is unused without ``bool_masked_pos`` (a zero gradient).  Served: calls without
    ``bool_masked_pos`` (a tensor keyword, which book-keeping refuses at the call) and without
    ``interpolate_pos_encoding``, whose position embeddings are interpolated (re-run per example: exact without
    dropout, refused with it)."""

    #: the arguments of ``ViTEmbeddings.forward`` that :meth:`serves` reads
    ARGUMENTS = ("pixel_values", "bool_masked_pos", "interpolate_pos_encoding")

    def applies(self, layer: nn.Module) -> bool:
        cls_token, positions = getattr(layer, "cls_token", None), getattr(layer, "position_embeddings", None)
        return (isinstance(cls_token, nn.Parameter) and isinstance(positions, nn.Parameter) and positions.dim() == 3
                and cls_token.shape == (1, 1, positions.shape[2])
                and type(getattr(layer, "dropout", None)) is nn.Dropout
                and isinstance(getattr(layer, "patch_embeddings", None), nn.Module)
                and "forward" not in layer.__dict__  # another library's hooks may have replaced it
                and set(self.ARGUMENTS) <= set(inspect.signature(type(layer).forward).parameters))

    def capture_point(self, layer: nn.Module) -> nn.Module:
        return layer.dropout

    def serves(self, layer: nn.Module, args: tuple, kwargs: dict) -> bool:
        arguments = _call_arguments(layer, args, kwargs)
        return arguments is not None and arguments["bool_masked_pos"] is None \
            and not arguments["interpolate_pos_encoding"]

    def gradients(self, layer: nn.Module, captured_grad: torch.Tensor) -> dict[nn.Parameter, Contribution]:
        positions = layer.position_embeddings
        if captured_grad.shape[1:] != positions.shape[1:]:
            raise UnsupportedLayerError(
                f"{type(layer).__name__}: its dropout's input has shape {tuple(captured_grad.shape)}, not (batch, "
                f"{', '.join(map(str, positions.shape[1:]))}) as its position embeddings: this version of its "
                f"forward is not the one its captured source reads")
        grad = captured_grad.to(compute_dtype(captured_grad.dtype))
        return {positions: MaterialisedGradients(grad.unsqueeze(1)),
                layer.cls_token: MaterialisedGradients(grad[:, None, :1])}


def _call_arguments(layer: nn.Module, args: tuple, kwargs: dict) -> Optional[dict[str, Any]]:
    """The call's arguments by name, defaults included (None: the call does not fit the forward's signature,
    which the forward then refuses itself)."""
    try:
        bound = inspect.signature(type(layer).forward).bind(layer, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


__all__ = ["CAPTURED_GRADIENT", "CAPTURED_SOURCES", "CapturedSource", "captured_source", "register_captured_source"]
