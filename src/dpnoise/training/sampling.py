"""Poisson sampling of a data set, or of one rank's shard of it, with batches on the run's device.

One process samples every example independently with probability q at every step (the sampled
Gaussian / Laplace mechanisms the accountants assume).  K processes split the data set into K
disjoint shards (rank r holds the examples r, r + K, r + 2K, ...) and each samples its own shard
at the same global rate q with its own generator, so that the union of the K local batches is again
a Poisson(q) sample of the whole data set: every example is in it independently with probability
q.  The generators must be seeded differently on each rank (identically seeded ranks would pick the
same positions of their shards, and the inclusions would not be independent).

Every rank yields the same number of batches per pass, empty ones included (an empty local batch
still takes its step: a rank that skipped it would desynchronise the others).  An empty batch has
the structure of the others (tensors, possibly in tuples, lists and dicts) with zero examples
(:class:`CollateWithEmpty`); the tracker tells the optimizer that it is empty, so that a model which
cannot run on zero examples (Hugging Face transformers) may skip its forward pass.

In one process on the CPU the draws are those of Opacus's ``UniformWithReplacementSampler`` with
the same generator (``torch.rand(N) < q``), so the batches are the ones ``DPDataLoader`` gave.

Logical and physical batches: with ``max_physical_batch_size`` m, each Poisson batch (the logical
batch, one accounted step) is yielded as ceil(n / m) physical batches of at most m examples (one
empty batch when n = 0).  The loader tells the optimizer, through a :class:`LogicalBatchTracker`,
whether the physical batch it yielded last ends its logical batch: only then does the optimizer
noise the accumulated clipped sum and take the step (Opacus's ``BatchMemoryManager`` does the same).
Each physical batch's indices come as a :class:`~dpnoise.training.provenance.DrawnBatch` (its draw,
piece and number of pieces), and the collate function or the loader registers the collated batch with
the engine's :class:`~dpnoise.training.provenance.BatchProvenance`, which the optimizer asks at every
step (docs/TRAINING.md, "Which batches a step may use").
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from dpnoise.prepared import PreparedForAccelerate
from dpnoise.training.devices import seeded_generator, to_device
from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.privacy_units import PrivacyUnits
from dpnoise.training.provenance import BatchProvenance, DrawnBatch, RegisteredBatch


def shard_indices(size: int, rank: int, world_size: int) -> torch.Tensor:
    """The indices of rank ``rank``'s shard of a data set of ``size`` examples (every K-th from ``rank``)."""
    return torch.arange(rank, size, world_size)


class LogicalBatchTracker:
    """The physical batches a loader yielded, as the sampler made them (:class:`DrawnBatch`), in order.

    The sampler queues each batch's indices as it makes them, and the loader takes one off per batch it
    yields (the order a ``DataLoader`` keeps, workers or not): :attr:`last` is the batch just yielded.
    An optimizer given the tracker itself (not the engine's provenance) trusts that the step is about
    :attr:`last` (:meth:`take`), as when batches are fed by hand to an optimizer built directly.
    """

    def __init__(self) -> None:
        self.queued: deque[DrawnBatch] = deque()
        #: the physical batch yielded last (None before the first)
        self.last: Optional[DrawnBatch] = None

    def queue(self, drawn: DrawnBatch) -> None:
        self.queued.append(drawn)

    def advance(self) -> DrawnBatch:
        """The loader yielded the next physical batch: its indices and place in its draw."""
        self.last = self.queued.popleft()
        return self.last

    def take(self) -> DrawnBatch:
        """The batch a step is about: the one yielded last (before any: one whole batch of unknown size)."""
        return self.last if self.last is not None else WHOLE_BATCH


#: the batch an optimizer without a loader takes: a whole logical batch whose size it does not know
WHOLE_BATCH = DrawnBatch([], draw=0, piece=0, pieces=1)
WHOLE_BATCH.size = None


def system_random_inclusions(size: int, sample_rate: float) -> torch.Tensor:
    """``(size,)`` Bernoulli inclusions from the operating system's CSPRNG (secure mode): example i is in
    when a uniform 64-bit integer from ``os.urandom`` is below ``floor(sample_rate * 2^64)``, so that each is
    included with probability at most ``sample_rate`` (less by under 2^-64; a smaller rate only adds privacy)."""
    threshold = min(int(sample_rate * 2.0**64), 2**64 - 1)
    words = np.frombuffer(os.urandom(8 * size), dtype=np.uint64)
    return torch.from_numpy(words < np.uint64(threshold))


class PoissonShardSampler(Sampler[list[int]]):
    """Batches of the examples ``indices``, each included independently with probability ``sample_rate``.

    The draws are made by ``generator`` on its device; ``steps`` logical batches (empty ones
    included) per pass, ``int(1 / sample_rate)`` by default as in Opacus.  With
    ``max_physical_batch_size`` each logical batch is yielded in physical batches of at most that
    size, and ``tracker`` is told which physical batch ends each logical one.
    """

    def __init__(self, indices: torch.Tensor, sample_rate: float, generator: torch.Generator,
                 steps: Optional[int] = None, max_physical_batch_size: Optional[int] = None,
                 tracker: Optional[LogicalBatchTracker] = None, system_random: bool = False,
                 units: Optional[PrivacyUnits] = None):
        self.indices = indices
        #: privacy units: each unit, with all its examples, is included with probability ``sample_rate``
        self.units = units
        self.sample_rate = sample_rate
        self.generator = generator
        self.steps = int(1 / sample_rate) if steps is None else steps
        self.max_physical_batch_size = max_physical_batch_size
        self.tracker = tracker
        #: Poisson draws made so far (the next draw's index)
        self.draws = 0
        #: draw the inclusions from the OS's CSPRNG (secure mode) instead of ``generator``
        self.system_random = system_random

    def inclusions(self) -> torch.Tensor:
        """One Poisson draw: whether each example of the shard is in the batch (with privacy units: one draw per
        unit, which all its examples follow)."""
        draws = len(self.indices) if self.units is None else self.units.count
        if self.system_random:
            included = system_random_inclusions(draws, self.sample_rate)
        else:
            included = torch.rand(draws, generator=self.generator, device=self.generator.device) < self.sample_rate
        return included if self.units is None else included.cpu()[self.units.of_example[self.indices]]

    def __len__(self) -> int:
        """Logical batches per pass (the physical ones are as many or more, depending on the draws)."""
        return self.steps

    def __iter__(self) -> Iterator[DrawnBatch]:
        for _ in range(self.steps):
            selected = self.indices[self.inclusions().nonzero().reshape(-1).cpu()].tolist()
            size = self.max_physical_batch_size or max(len(selected), 1)
            starts = range(0, max(len(selected), 1), size)  # an empty logical batch: one empty physical batch
            draw, self.draws = self.draws, self.draws + 1
            for piece, start in enumerate(starts):
                batch = DrawnBatch(selected[start : start + size], draw=draw, piece=piece, pieces=len(starts))
                if self.tracker is not None:
                    self.tracker.queue(batch)
                yield batch


@dataclass(frozen=True)
class DrawnExamples:
    """The examples of one physical batch and its indices with their place in their Poisson draw, on their
    way to the collate function: a list of examples, or (``collated``) the batch itself (a
    ``TensorDataset``'s tensors at the indices)."""

    drawn: DrawnBatch
    examples: Any
    collated: bool = False


class DrawnDataset(Dataset):
    """A data set read a physical batch at a time: ``__getitems__`` gives the batch's examples together
    with its :class:`DrawnBatch`, so that the collate function can register what it collates.

    A ``TensorDataset`` is read by one indexing of each tensor (``tensors_at_once``): no per-example
    calls, no stacking (an empty list of indices gives empty tensors of the right shapes)."""

    def __init__(self, dataset: Dataset, tensors_at_once: bool):
        self.dataset = dataset
        self.tensors_at_once = tensors_at_once

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, drawn: DrawnBatch) -> DrawnExamples:
        if self.tensors_at_once:
            positions = torch.as_tensor(list(drawn), dtype=torch.long)
            return DrawnExamples(drawn, tuple(tensor[positions] for tensor in self.dataset.tensors), collated=True)
        return DrawnExamples(drawn, [self.dataset[index] for index in drawn])


def empty_batch_like(batch: Any) -> Any:
    """``batch`` (collated: tensors, possibly in tuples, lists and dicts) with zero examples: each
    tensor's first (batch) dimension set to 0, its other dimensions and dtype kept."""
    if isinstance(batch, torch.Tensor):
        return batch.new_empty((0, *batch.shape[1:]))
    if isinstance(batch, Mapping):
        return {key: empty_batch_like(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(empty_batch_like(value) for value in batch)
    raise InvalidTrainingOptionError(f"batches must be tensors, possibly in tuples, lists and dicts (an empty Poisson "
                                     f"batch is made of the same with zero examples); the collate function gave a "
                                     f"{type(batch).__name__}")


class RegisteringCollate:
    """Collates a physical batch with ``collate`` (unless ``DrawnDataset`` gave it collated) and, in the main
    process, registers it with ``provenance`` (with worker processes the private loader registers it); so
    a wrapper that rebuilds the ``DataLoader`` from its sampler and collate function keeps the
    provenance.  A plain list of examples is collated and not registered."""

    def __init__(self, collate: Callable[[list], Any], provenance: Optional[BatchProvenance]):
        self.collate = collate
        self.provenance = provenance

    def __call__(self, examples: Union[DrawnExamples, list]) -> Any:
        if not isinstance(examples, DrawnExamples):
            return self.collate(examples)
        batch = examples.examples if examples.collated else self.collate(examples.examples)
        if self.provenance is not None and get_worker_info() is None:
            self.provenance.register(batch, examples.drawn)
        return batch


class CollateWithEmpty:
    """``collate`` for a list of examples, and for an empty one (an empty Poisson batch) the structure
    of ``collate([example])`` with zero examples (:func:`empty_batch_like`)."""

    def __init__(self, collate: Callable[[list], Any], example: Any) -> None:
        self.collate = collate
        self.empty = empty_batch_like(collate([example]))

    def __call__(self, examples: list) -> Any:
        return self.collate(examples) if examples else self.empty


class DeviceDataLoader(DataLoader):
    """A ``DataLoader`` whose batches are checked by ``check`` (when given) and moved to ``device``
    (floating tensors cast to ``float_dtype``); with a ``tracker``, each batch's :class:`DrawnBatch` is
    read as it is yielded and, with a ``provenance``, the batch registered (or, registered by the
    collate function, its moved tensors added)."""

    #: accelerate's prepare() leaves the private loader as it is (:mod:`dpnoise.prepared`)
    _is_accelerate_prepared = PreparedForAccelerate()

    def __init__(self, dataset: Dataset, *, device: torch.device, float_dtype: Optional[torch.dtype],
                 tracker: Optional[LogicalBatchTracker] = None, provenance: Optional[BatchProvenance] = None,
                 check: Optional[Callable[[Any], None]] = None, **options: Any):
        super().__init__(dataset, **options)
        self.device = device
        self.float_dtype = float_dtype
        self.tracker = tracker
        self.provenance = provenance
        self.check = check

    def __iter__(self) -> Iterator[Any]:
        if self.tracker is not None:
            self.tracker.queued.clear()  # batches an abandoned pass prefetched
        for batch in super().__iter__():
            if self.check is not None:
                self.check(batch)
            moved = to_device(batch, self.device, self.float_dtype)
            if self.tracker is not None:
                drawn = self.tracker.advance()
                if self.provenance is not None:
                    self.provenance.moved(self._registered(drawn, batch), moved)
            yield moved

    def _registered(self, drawn: DrawnBatch, batch: Any) -> RegisteredBatch:
        """The registration of ``batch`` by the collate function (main process), or a new one (workers)."""
        for registered in reversed(self.provenance.pending):
            if registered.batch is batch:
                return registered
        return self.provenance.register(batch, drawn)


def poisson_loader(dataset: Dataset, *, sample_rate: float, shard: torch.Tensor, generator: torch.Generator,
                   device: torch.device, float_dtype: Optional[torch.dtype],
                   collate_fn: Optional[Callable] = None, num_workers: int = 0,
                   worker_generator: Optional[torch.Generator] = None,
                   max_physical_batch_size: Optional[int] = None,
                   tracker: Optional[LogicalBatchTracker] = None,
                   provenance: Optional[BatchProvenance] = None, system_random: bool = False,
                   check: Optional[Callable[[Any], None]] = None,
                   units: Optional[PrivacyUnits] = None) -> DeviceDataLoader:
    """Poisson batches of ``shard`` (indices into ``dataset``) at ``sample_rate``, on ``device``; with
    ``max_physical_batch_size``, each in physical batches of at most that size (``tracker`` says
    which one ends it); every batch registered with ``provenance`` and checked by ``check`` when given;
    ``system_random``: the inclusions drawn from the OS's CSPRNG (secure mode), not from ``generator``;
    ``units``: Poisson sampling of privacy units (``sample_rate`` is then a unit's).

    ``worker_generator`` (CPU) is the one the ``DataLoader`` draws its worker base seed from at every
    new pass; it is kept apart from the sampler's, so that the draws do not depend on pass boundaries.
    """
    sampler = PoissonShardSampler(shard, sample_rate, generator, max_physical_batch_size=max_physical_batch_size,
                                  tracker=tracker, system_random=system_random, units=units)
    # A TensorDataset with the default collation is read a whole batch at a time (the same batches, empty
    # ones included, several times faster at batches of thousands).
    tensors_at_once = type(dataset) is TensorDataset and collate_fn in (None, default_collate)
    collate = CollateWithEmpty(collate_fn or default_collate, dataset[0])
    loader = DeviceDataLoader(
        DrawnDataset(dataset, tensors_at_once),
        device=device,
        float_dtype=float_dtype,
        tracker=tracker,
        provenance=provenance,
        check=check,
        batch_sampler=sampler,
        collate_fn=RegisteringCollate(collate, provenance),
        num_workers=num_workers,
        generator=worker_generator,
    )
    loader.sample_rate = sample_rate
    return loader


def training_loader(data_loader: DataLoader, *, poisson_sampling: bool, device: torch.device,
                    float_dtype: Optional[torch.dtype], generator: torch.Generator, shard: torch.Tensor,
                    worker_seed: int, system_random: bool, max_physical_batch_size: Optional[int],
                    tracker: LogicalBatchTracker, provenance: Optional[BatchProvenance], check: Callable[[Any], None],
                    units: Optional[PrivacyUnits] = None) -> DeviceDataLoader:
    """The private loader of ``data_loader``'s data set: Poisson batches of this rank's ``shard`` at rate
    batch_size / N drawn with ``generator`` (or the OS's CSPRNG: ``system_random``, secure mode), or shuffled
    fixed-size batches (warned: the accountants do not cover them); its batches checked by ``check``, on
    ``device``, split into physical batches if asked.  ``worker_seed`` seeds the data-loader workers: a
    DataLoader draws a worker base seed from its own generator at every pass, not from the sampler's, so that
    the sampler's draws do not depend on pass boundaries (what makes a resumed run identical to an
    uninterrupted one).  ``units``: Poisson batches of privacy units, at rate batch_size / (number of units)."""
    dataset = data_loader.dataset
    common = dict(collate_fn=data_loader.collate_fn, num_workers=data_loader.num_workers, check=check)
    if not poisson_sampling:
        warnings.warn("poisson_sampling=False: batches are shuffled fixed-size batches, but the accountants assume "
                      "Poisson sampling; the reported epsilon does not cover this run", stacklevel=4)
        return DeviceDataLoader(dataset, device=device, float_dtype=float_dtype, batch_size=data_loader.batch_size,
                                shuffle=True, generator=generator, **common)
    population = len(dataset) if units is None else units.count
    return poisson_loader(dataset, sample_rate=data_loader.batch_size / population, shard=shard, generator=generator, units=units,
                          device=device, float_dtype=float_dtype, worker_generator=seeded_generator(worker_seed),
                          max_physical_batch_size=max_physical_batch_size, tracker=tracker, provenance=provenance,
                          system_random=system_random, **common)
