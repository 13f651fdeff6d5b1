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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset
from torch.utils.data._utils.collate import default_collate

from dpnoise.training.devices import to_device
from dpnoise.training.errors import InvalidTrainingOptionError


def shard_indices(size: int, rank: int, world_size: int) -> torch.Tensor:
    """The indices of rank ``rank``'s shard of a data set of ``size`` examples (every K-th from ``rank``)."""
    return torch.arange(rank, size, world_size)


class LogicalBatchTracker:
    """Whether the physical batch a loader yielded last ends its logical (Poisson) batch, and its size.

    The sampler queues one (flag, size) pair per physical batch in the order it makes them, and the
    loader takes one off per batch it yields (the order a ``DataLoader`` keeps, workers or not), so
    that what is read at ``optimizer.step()`` is about the batch just trained on.
    """

    def __init__(self) -> None:
        self.queued: deque[tuple[bool, Optional[int]]] = deque()
        #: True before the first batch and after every batch that ends a logical batch
        self.ends_logical_batch = True
        #: examples in the physical batch yielded last (None: unknown); 0 for an empty Poisson batch
        self.batch_size: Optional[int] = None

    def queue(self, ends_logical_batch: bool, batch_size: Optional[int] = None) -> None:
        self.queued.append((ends_logical_batch, batch_size))

    def advance(self) -> None:
        """The loader yielded the next physical batch."""
        self.ends_logical_batch, self.batch_size = self.queued.popleft()


class PoissonShardSampler(Sampler[list[int]]):
    """Batches of the examples ``indices``, each included independently with probability ``sample_rate``.

    The draws are made by ``generator`` on its device; ``steps`` logical batches (empty ones
    included) per pass, ``int(1 / sample_rate)`` by default as in Opacus.  With
    ``max_physical_batch_size`` each logical batch is yielded in physical batches of at most that
    size, and ``tracker`` is told which physical batch ends each logical one.
    """

    def __init__(self, indices: torch.Tensor, sample_rate: float, generator: torch.Generator,
                 steps: Optional[int] = None, max_physical_batch_size: Optional[int] = None,
                 tracker: Optional[LogicalBatchTracker] = None):
        self.indices = indices
        self.sample_rate = sample_rate
        self.generator = generator
        self.steps = int(1 / sample_rate) if steps is None else steps
        self.max_physical_batch_size = max_physical_batch_size
        self.tracker = tracker

    def __len__(self) -> int:
        """Logical batches per pass (the physical ones are as many or more, depending on the draws)."""
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            drawn = torch.rand(len(self.indices), generator=self.generator, device=self.generator.device)
            selected = self.indices[(drawn < self.sample_rate).nonzero().reshape(-1).cpu()].tolist()
            size = self.max_physical_batch_size or max(len(selected), 1)
            starts = range(0, max(len(selected), 1), size)  # an empty logical batch: one empty physical batch
            for start in starts:
                if self.tracker is not None:
                    self.tracker.queue(start == starts[-1], len(selected[start : start + size]))
                yield selected[start : start + size]


class TensorBatches(Dataset):
    """A ``TensorDataset`` read a batch at a time: ``batches[indices]`` is the tuple of its tensors at
    ``indices`` (a list of positions; an empty list gives empty tensors of the right shapes)."""

    def __init__(self, dataset: TensorDataset):
        self.tensors = dataset.tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        positions = torch.as_tensor(indices, dtype=torch.long)
        return tuple(tensor[positions] for tensor in self.tensors)


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


class CollateWithEmpty:
    """``collate`` for a list of examples, and for an empty one (an empty Poisson batch) the structure
    of ``collate([example])`` with zero examples (:func:`empty_batch_like`)."""

    def __init__(self, collate: Callable[[list], Any], example: Any) -> None:
        self.collate = collate
        self.empty = empty_batch_like(collate([example]))

    def __call__(self, examples: list) -> Any:
        return self.collate(examples) if examples else self.empty


class DeviceDataLoader(DataLoader):
    """A ``DataLoader`` whose batches are moved to ``device`` (floating tensors cast to ``float_dtype``)."""

    def __init__(self, dataset: Dataset, *, device: torch.device, float_dtype: Optional[torch.dtype],
                 tracker: Optional[LogicalBatchTracker] = None, **options: Any):
        super().__init__(dataset, **options)
        self.device = device
        self.float_dtype = float_dtype
        self.tracker = tracker

    def __iter__(self) -> Iterator[Any]:
        if self.tracker is not None:
            self.tracker.queued.clear()  # flags of batches an abandoned pass prefetched
        for batch in super().__iter__():
            if self.tracker is not None:
                self.tracker.advance()
            yield to_device(batch, self.device, self.float_dtype)


def poisson_loader(dataset: Dataset, *, sample_rate: float, shard: torch.Tensor, generator: torch.Generator,
                   device: torch.device, float_dtype: Optional[torch.dtype],
                   collate_fn: Optional[Callable] = None, num_workers: int = 0,
                   worker_generator: Optional[torch.Generator] = None,
                   max_physical_batch_size: Optional[int] = None,
                   tracker: Optional[LogicalBatchTracker] = None) -> DeviceDataLoader:
    """Poisson batches of ``shard`` (indices into ``dataset``) at ``sample_rate``, on ``device``; with
    ``max_physical_batch_size``, each in physical batches of at most that size (``tracker`` says
    which one ends it).

    ``worker_generator`` (CPU) is the one the ``DataLoader`` draws its worker base seed from at every
    new pass; it is kept apart from the sampler's, so that the draws do not depend on pass boundaries.
    """
    sampler = PoissonShardSampler(shard, sample_rate, generator, max_physical_batch_size=max_physical_batch_size,
                                  tracker=tracker)
    if type(dataset) is TensorDataset and collate_fn in (None, default_collate):
        # Whole batches by one indexing of each tensor: no per-example calls, no stacking (the same
        # batches, empty ones included, several times faster at batches of thousands).
        loader = DeviceDataLoader(TensorBatches(dataset), device=device, float_dtype=float_dtype, tracker=tracker,
                                  sampler=sampler, batch_size=None, num_workers=num_workers, generator=worker_generator)
        loader.sample_rate = sample_rate
        return loader
    loader = DeviceDataLoader(
        dataset,
        device=device,
        float_dtype=float_dtype,
        tracker=tracker,
        batch_sampler=sampler,
        collate_fn=CollateWithEmpty(collate_fn or default_collate, dataset[0]),
        num_workers=num_workers,
        generator=worker_generator,
    )
    loader.sample_rate = sample_rate
    return loader
