"""Forwarded attributes: what a private module forwards to the model it wraps, so that it is used as the
model is, and the engine's attributes that live in its plan or step ledger."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from dpnoise.prepared import PreparedForAccelerate


class ModelForwarding:
    """A private module's attributes that it does not have itself are the wrapped model's
    (``save_pretrained``, ``config``, ``generate``, ``get_input_embeddings``, ...); :meth:`unwrap` is the
    model itself (e.g. ``private.unwrap().merge_and_unload()`` for a peft model)."""

    _module: nn.Module
    #: accelerate's prepare() leaves the private module unwrapped (:mod:`dpnoise.prepared`)
    _is_accelerate_prepared = PreparedForAccelerate()

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


class Forwarded:
    """An attribute kept for users that lives in the object's ``owner`` attribute (e.g. the engine's plan or
    step ledger): ``getattr(obj.<owner>, name)``, or ``empty`` while the owner is None; ``settable`` ones are
    set on the owner (refused with the error ``refusal()`` while it is None)."""

    def __init__(self, owner: str, name: str, empty: Any, doc: str, settable: bool = False,
                 refusal: Optional[Callable[[], Exception]] = None) -> None:
        self.owner, self.name, self.empty, self.settable, self.refusal = owner, name, empty, settable, refusal
        self.__doc__ = doc

    def __get__(self, obj: Any, kind: Optional[type] = None) -> Any:
        if obj is None:
            return self
        holder = getattr(obj, self.owner)
        return self.empty if holder is None else getattr(holder, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{self.name} is read-only: it belongs to the {self.owner}")
        holder = getattr(obj, self.owner)
        if holder is None:
            raise self.refusal() if self.refusal else AttributeError(f"{self.name} cannot be set without a {self.owner}")
        setattr(holder, self.name, value)
