"""Step provenance: an optimizer step is noised and accounted only for a batch the private loader drew.

The accountants compose, per optimizer step, one Poisson-subsampled release at the private loader's
rate q.  That is the truth only when the gradients released at the step come from one Poisson draw of
that loader, every physical piece of the draw once, and no draw twice.  Ordinary loops leave that
without a word: a user's own ``DataLoader``, a framework's loader (``transformers.Trainer`` builds one
from the dataset), a wrapper that re-deals or repeats the draws (``accelerate``'s ``prepare()`` under
several processes pads a rank with one of its earlier batches), a forward pass on inputs made in the
loop.  Each of these would be accounted as a Poisson step it is not; here it is refused at
``optimizer.step()``, before any noise, with one error that names what happened and the fix.

How the provenance is kept:

* the sampler yields each physical batch's indices as a :class:`DrawnBatch`: which Poisson draw it is
  (counted from 0 in this process), which piece of it, of how many;
* the loader's collate function (in the main process: also under a wrapper that rebuilds the
  ``DataLoader`` from its sampler and collate function, as ``accelerate`` does) or, with worker
  processes, the private loader itself registers the collated batch with :class:`BatchProvenance`;
* a forward pre-hook on the model finds, at every training-mode forward pass with autograd on, the
  registered batch whose tensors the inputs are: the same tensor or a view of it, or the same values on
  another device or in another dtype (a framework's device move keeps the provenance).  Inputs
  computed in the loop from a batch are refused unless declared with :meth:`BatchProvenance.derived`;
* ``optimizer.step()`` takes the step's batch from :meth:`BatchProvenance.take`: exactly one training
  forward pass since the last step, on a registered batch, the draws strictly increasing and the pieces
  of a draw in order; a step with no forward pass is the noise-only step of an empty draw.

Under several processes the optimizers also check that every rank steps on the same draw index (the
ranks' samplers draw in lockstep), so that a wrapper that deals different draws to different ranks is
refused as well.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch

from dpnoise.training.batches import leading_size
from dpnoise.training.errors import ForeignBatchError

#: registered batches kept while no step has taken them (a loader's prefetching, an abandoned pass)
MAX_PENDING_BATCHES = 16

#: False within :func:`unobserved_passes`
_OBSERVING: ContextVar[bool] = ContextVar("observing_forward_passes", default=True)

FIX = ("train on the batches of the loader make_private returned (max_physical_batch_size= splits a Poisson batch "
       "into pieces for memory); transform examples in the dataset, its collate function or the model")


@contextmanager
def unobserved_passes() -> Iterator[None]:
    """Within: no :class:`BatchProvenance` notes training forward passes.  For passes that no step
    releases, between steps (the per-example check's, on a batch of its own): the next step still
    sees only its own batch's pass."""
    token = _OBSERVING.set(False)
    try:
        yield
    finally:
        _OBSERVING.reset(token)


class DrawnBatch(list):
    """The dataset indices of one physical batch, and its place in its Poisson draw (the logical batch).

    A list, so that any ``DataLoader`` (and a wrapper that rebuilds one from the batch sampler) takes it
    as a batch of indices; its attributes travel with it to worker processes.
    """

    def __init__(self, indices: Iterable[int], *, draw: int, piece: int, pieces: int):
        super().__init__(indices)
        #: the Poisson draw (logical batch) it belongs to, counted from 0 in this process
        self.draw = draw
        #: its position among the draw's physical batches, and their number
        self.piece = piece
        self.pieces = pieces
        #: examples in the batch (None: not known)
        self.size: Optional[int] = len(self)

    @property
    def ends_logical_batch(self) -> bool:
        return self.piece == self.pieces - 1

    @property
    def indices(self) -> list[int]:
        """The data set indices of its examples."""
        return list(self)


@dataclass(eq=False)
class RegisteredBatch:
    """A physical batch the private loader produced: its place in its draw and its tensors."""

    draw: int
    piece: int
    pieces: int
    #: examples in the batch
    size: int
    #: the batch as collated (pairs or dicts of tensors), later as moved to the run's device
    batch: Any
    #: every tensor the batch holds, and tensors declared as derived from them
    tensors: list[torch.Tensor] = field(default_factory=list)
    #: the data set indices of its examples, in the batch's order
    indices: list[int] = field(default_factory=list)

    @property
    def ends_logical_batch(self) -> bool:
        return self.piece == self.pieces - 1

    def describe(self) -> str:
        return f"piece {self.piece + 1} of {self.pieces} of Poisson draw {self.draw}"


def batch_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and mappings), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    return [tensor for item in items for tensor in batch_tensors(item)]


def holds(registered: torch.Tensor, seen: torch.Tensor) -> bool:
    """Whether ``seen`` is ``registered``: the same tensor, a view of its storage with the same leading
    dimension, or the same values on another device or in another dtype."""
    if seen is registered:
        return True
    if seen.dim() == 0 or registered.dim() == 0 or len(seen) != len(registered):
        return False
    if seen.device == registered.device and \
            seen.untyped_storage().data_ptr() == registered.untyped_storage().data_ptr():
        return True
    return seen.shape == registered.shape and bool(
        torch.equal(registered.to(device=seen.device, dtype=seen.dtype), seen))


class BatchProvenance:
    """The private loader's batches, and which of them each training forward pass and each step used."""

    def __init__(self) -> None:
        #: registered batches no step has taken yet, oldest first
        self.pending: deque[RegisteredBatch] = deque(maxlen=MAX_PENDING_BATCHES)
        #: what each training forward pass since the last step ran on (None: no registered batch)
        self.forwards: list[Optional[RegisteredBatch]] = []
        #: the last draw a step completed (-1: none yet), and the draw whose pieces are being taken
        self.last_draw = -1
        self.open: Optional[RegisteredBatch] = None

    # --------------------------------------------------------------------------- the loader's side
    def register(self, batch: Any, drawn: DrawnBatch) -> RegisteredBatch:
        """Record a batch the private loader produced (collated from the indices ``drawn``)."""
        registered = RegisteredBatch(drawn.draw, drawn.piece, drawn.pieces, leading_size(batch) or 0, batch,
                                     batch_tensors(batch), list(drawn))
        self.pending.append(registered)
        return registered

    def moved(self, registered: RegisteredBatch, batch: Any) -> None:
        """``registered`` as the loader yields it on the run's device (what the model will see)."""
        registered.batch = batch
        registered.tensors.extend(batch_tensors(batch))

    def derived(self, source: torch.Tensor, derived: torch.Tensor) -> torch.Tensor:
        """Declare ``derived`` (inputs computed in the loop from a private batch's tensor ``source``, one
        row per example) as part of that batch; returns ``derived``: ``model(provenance.derived(x, f(x)))``."""
        for registered in self.pending:
            if any(holds(tensor, source) for tensor in registered.tensors):
                registered.tensors.append(derived)
                return derived
        raise ForeignBatchError("derived(): the source tensor is not in a batch of the private loader that no step "
                                "has taken yet")

    # --------------------------------------------------------------------------- the model's side
    def observe_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """A forward pre-hook: note the registered batch a training forward pass runs on (or None)."""
        if _OBSERVING.get() and module.training and torch.is_grad_enabled():
            self.forwards.append(self.find(batch_tensors((args, kwargs))))

    def find(self, seen: list[torch.Tensor]) -> Optional[RegisteredBatch]:
        """The oldest pending registered batch holding one of the tensors ``seen`` (None: none does)."""
        for registered in self.pending:
            if any(holds(tensor, candidate) for candidate in seen for tensor in registered.tensors):
                return registered
        return None

    # --------------------------------------------------------------------------- the optimizer's side
    def take(self) -> RegisteredBatch:
        """The batch this ``optimizer.step()`` releases, after checking where it came from.

        Raises :class:`ForeignBatchError` (nothing noised or accounted) unless the training forward
        passes since the last step were exactly one, on a batch of the private loader, that is the next
        piece of the draw being taken or the first piece of a draw after the last one completed; with no
        forward pass, the oldest pending batch must be an empty draw (its noise-only step).
        """
        forwards, self.forwards = self.forwards, []
        if any(batch is None for batch in forwards):
            raise ForeignBatchError(
                "optimizer.step() after a training forward pass on inputs that are not a batch of the private "
                "loader (another DataLoader, a framework's own loader, or inputs computed in the loop); the "
                f"accountants would count it as a Poisson step it is not. Fix: {FIX}; run evaluation passes under "
                "torch.no_grad() or model.eval()")
        if len(forwards) > 1:
            raise ForeignBatchError(
                f"optimizer.step() after {len(forwards)} training forward passes (one physical batch per step: "
                f"{', '.join(batch.describe() for batch in forwards)}); gradient accumulation is not a Poisson step. "
                f"Fix: one forward and backward pass per optimizer.step(); for memory, make_private("
                f"max_physical_batch_size=...) splits each Poisson batch into pieces")
        batch = forwards[0] if forwards else self._empty_draw()
        self._check_order(batch)
        while self.pending and self.pending[0] is not batch:  # skipped (an abandoned pass): never taken
            self.pending.popleft()
        if self.pending:
            self.pending.popleft()
        if batch.ends_logical_batch:
            self.last_draw, self.open = batch.draw, None
        else:
            self.open = batch
        return batch

    def _empty_draw(self) -> RegisteredBatch:
        """The empty draw a step without a forward pass takes (HF models cannot run on zero examples)."""
        empty = next((batch for batch in self.pending if batch.draw > self.last_draw), None)
        if empty is None or empty.size or self.open is not None:
            raise ForeignBatchError(
                "optimizer.step() without a training forward pass through the private model since the last step "
                "(only an empty Poisson batch takes a step without one); the step would release nothing new but "
                f"be accounted. Fix: {FIX}")
        return empty

    def _check_order(self, batch: RegisteredBatch) -> None:
        """Refuse a piece out of its draw's order, a draw already taken, or a draw left unfinished."""
        if self.open is not None and (batch.draw != self.open.draw or batch.piece != self.open.piece + 1):
            raise ForeignBatchError(
                f"optimizer.step() on {batch.describe()} while {self.open.describe()} was the last piece taken: "
                f"the pieces of a Poisson batch make one step together, in order (a wrapper re-dealt or dropped "
                f"the loader's batches). Fix: {FIX}")
        if self.open is None and (batch.draw <= self.last_draw or batch.piece != 0):
            what = "was already released" if batch.draw <= self.last_draw else "did not start at its first piece"
            raise ForeignBatchError(
                f"optimizer.step() on {batch.describe()}, a Poisson draw that {what} (a wrapper repeated or "
                f"re-dealt the loader's batches, e.g. to pad a process's share); each draw makes exactly one "
                f"step. Fix: {FIX}")
