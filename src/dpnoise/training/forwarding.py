"""What a private module forwards to the model it wraps, so that it is used as the model is."""

from __future__ import annotations

from typing import Any

from torch import nn


class ModelForwarding:
    """A private module's attributes that it does not have itself are the wrapped model's
    (``save_pretrained``, ``config``, ``generate``, ``get_input_embeddings``, ...); :meth:`unwrap` is the
    model itself (e.g. ``private.unwrap().merge_and_unload()`` for a peft model)."""

    _module: nn.Module

    def unwrap(self) -> nn.Module:
        """The model this private module wraps (the one given to ``make_private``)."""
        return self._modules["_module"]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            wrapped = self.__dict__.get("_modules", {}).get("_module")
            if wrapped is None or name.startswith("__"):
                raise
            return getattr(wrapped, name)
