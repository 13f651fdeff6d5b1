"""Distributed private training on ``torch.distributed``: ranks, their seeds, and checked collectives.

K processes (ranks) train one model: each samples its shard of the data at the global rate q
(:mod:`dpnoise.training.sampling`), clips its local batch, adds its share of the noise and the
noisy sums are all-reduced, so that every rank applies the update (global clipped sum + noise) /
expected global batch size, exactly as one process would (docs/DISTRIBUTED.md).  This module holds
what the engine needs from the process group:

* :func:`current_group`: the initialised default process group (None in one process);
* :func:`join_process_group`: initialise it from ``torchrun``'s environment (gloo on the CPU, nccl
  on CUDA) with a timeout, so that a dead or stalled rank makes the others fail within a minute;
* :func:`generator_seeds`: per-rank seeds (different on every rank);
* :class:`RankGroup`: the collectives, each turning a failure of the group into a one-line
  :class:`RankLostError`, and the consistency checks (same setup; same step count and every noise
  share added, both carried by the step's one all-reduce).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dpnoise.errors import DpnoiseError, ProcessGroupLostError

#: how long a collective waits for the other ranks before failing (process groups made here)
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=45)
#: base-256 digits of a value checked by :meth:`RankGroup.all_reduce_sum` (values below 2^64)
COUNT_DIGITS = 8


class DistributedError(DpnoiseError, RuntimeError):
    """The ranks of a distributed run lost each other (a rank died or stalled) or disagree (setup,
    step count, noise shares); the run stops on every rank instead of continuing inconsistently."""


class RankLostError(DistributedError, ProcessGroupLostError):
    """A collective failed: another rank died or stalled for more than the process group's timeout."""


@dataclass(frozen=True)
class RankGroup:
    """This process's place in the default process group, with checked collectives."""

    rank: int
    world_size: int
    #: where the collectives' tensors live (CUDA for nccl)
    device: torch.device

    def _collective(self, what: str, operation, *args, **kwargs) -> None:
        """Run the tensor collective ``operation`` (issued with ``async_op=True``, then waited for).

        Only a failure of the group becomes a :class:`RankLostError` naming ``what``: one raised while
        waiting for the other ranks (gloo raises a plain ``RuntimeError`` for a peer that closed its
        connection or timed out), or torch's ``DistError`` at any point.  Anything this rank raises while
        issuing the collective (a tensor the backend cannot take, a DTensor without a sharding strategy
        for it) never reached the other ranks: it is raised as itself, with a note naming the rank and
        ``what``, so that the rank's own error is the one reported, not a lost peer.
        """
        try:
            work = operation(*args, async_op=True, **kwargs)
        except dist.DistError as err:
            raise self._lost(what, err) from None
        except Exception as err:
            err.add_note(f"rank {self.rank} of {self.world_size}: raised by this rank while {what}")
            raise
        self._wait(what, work.wait)

    def _wait(self, what: str, waiting, *args) -> Any:
        """``waiting(*args)``, a step that waits for the other ranks: a ``RuntimeError`` in it is a failure of
        the group (:class:`RankLostError` naming ``what``)."""
        try:
            return waiting(*args)
        except RuntimeError as err:
            raise self._lost(what, err) from None

    def _lost(self, what: str, err: BaseException) -> RankLostError:
        """The :class:`RankLostError` of a collective ``what`` that failed with ``err`` (its first line kept)."""
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return RankLostError(f"rank {self.rank} of {self.world_size}: {what} failed: another rank died or stalled "
                             f"for more than the process group's timeout ({first})")

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor], what: str,
                       same: Optional[Mapping[str, int]] = None) -> None:
        """Sum ``tensors`` over all ranks, in place, in one all-reduce (flattened in their common dtype).

        ``same`` ({name: non-negative integer}): values every rank must hold, checked in the same
        all-reduce (no collective of their own, which on gloo costs about as much as the sum itself).
        Each rank writes its value, in base-256 digits (exact in every floating dtype), into slots of
        its own and zeros elsewhere; unless all ranks hold the same value, every rank raises
        :class:`DistributedError` after the all-reduce, before ``tensors`` are overwritten.
        """
        same = dict(same or {})
        dtype = tensors[0].dtype
        for tensor in tensors[1:]:
            dtype = torch.promote_types(dtype, tensor.dtype)
        slots = torch.zeros((len(same), self.world_size, COUNT_DIGITS), dtype=dtype, device=tensors[0].device)
        for row, value in zip(slots, same.values()):
            row[self.rank] = count_digits(value, dtype, tensors[0].device)
        flat = torch.cat([*(t.reshape(-1).to(dtype) for t in tensors), slots.reshape(-1)])
        self._collective(what, dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        held = flat[flat.numel() - slots.numel():].view_as(slots)
        for name, row in zip(same, held.tolist()):
            values = [digits_count(digits) for digits in row]
            if len(set(values)) != 1:
                raise DistributedError(f"ranks disagree on the {name}: " + ", ".join(
                    f"rank {r} has {v}" for r, v in enumerate(values)))
        offset = 0
        for tensor in tensors:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()

    def gather_objects(self, value: Any, what: str) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        gathered: list[Any] = [None] * self.world_size
        # all_gather_object has no async form; its local failures (pickling) are not RuntimeErrors
        self._wait(what, dist.all_gather_object, gathered, value)
        return gathered

    def check_same_setup(self, setup: dict[str, Any]) -> None:
        """Raise :class:`DistributedError` unless every rank was made private with the same ``setup``."""
        setups = self.gather_objects(setup, "comparing the privacy setups of the ranks")
        for rank, other in enumerate(setups):
            differing = [key for key in setup if other.get(key) != setup[key]]
            if differing:
                key = differing[0]
                raise DistributedError(f"ranks disagree on the privacy setup: {key} is {other.get(key)!r} on "
                                       f"rank {rank} and {setup[key]!r} on rank {self.rank}")

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's parameters and buffers (the ranks train one model).  The shards of a
        ``fully_shard`` model's parameters (DTensors) stay as they are: each rank holds another chunk of the
        one model, there is no copy to agree on."""
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                if not isinstance(tensor, DTensor):
                    self._collective("broadcasting rank 0's model", dist.broadcast, tensor, 0)


def count_digits(value: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The base-256 digits of ``value``, least significant first, as a :data:`COUNT_DIGITS`-vector of
    ``dtype`` (digits up to 255 are exact even in bfloat16, so a sum with zeros returns them unchanged)."""
    if not 0 <= value < 256 ** COUNT_DIGITS:
        raise ValueError(f"a value checked across ranks must be in [0, 2^64), got {value}")
    return torch.tensor([(value >> (8 * i)) & 255 for i in range(COUNT_DIGITS)], dtype=dtype, device=device)


def digits_count(digits: Sequence[float]) -> int:
    """The value whose :func:`count_digits` are ``digits``."""
    return sum(int(digit) << (8 * i) for i, digit in enumerate(digits))


def current_group(device: torch.device) -> Optional[RankGroup]:
    """The default process group as a :class:`RankGroup`; None when there is none or it has one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return RankGroup(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def launched_world_size() -> int:
    """The number of processes ``torchrun`` started (``WORLD_SIZE``; 1 outside ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_process_group(device: torch.device) -> tuple[torch.device, bool]:
    """Initialise the default process group from ``torchrun``'s environment when it started several
    processes and none is initialised yet (gloo on the CPU, nccl on CUDA; :data:`COLLECTIVE_TIMEOUT`).

    Returns the device this rank uses (``cuda:LOCAL_RANK`` for a CUDA run) and whether a group was
    initialised here (then :func:`leave_process_group` destroys it at the end).
    """
    if device.type == "cuda" and device.index is None and launched_world_size() > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda" and device.index is not None:  # "cuda" alone is the current device (torch refuses it)
        torch.cuda.set_device(device)
    if launched_world_size() == 1 or dist.is_initialized():
        return device, False
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    return device, True


def leave_process_group() -> None:
    """Destroy the default process group (made by :func:`join_process_group`)."""
    dist.destroy_process_group()


def generator_seeds(seed: int, rank: int = 0, world_size: int = 1,
                    resumed_at: Optional[int] = None) -> tuple[int, int, int]:
    """Seeds of one rank's (noise, Poisson sampling, data-loader worker) generators.

    One process: ``seed``, ``seed + 1``, ``seed + 2``.  Otherwise (K > 1 ranks, or generators
    re-seeded after a resume on another kind of device at step ``resumed_at``): three 64-bit seeds
    drawn by NumPy's ``SeedSequence`` from ``seed`` with the spawn key (K, rank[, resumed_at]), so
    that they differ between ranks and from the first ones.
    """
    if world_size == 1 and resumed_at is None:
        return seed, seed + 1, seed + 2
    key = (world_size, rank) if resumed_at is None else (world_size, rank, resumed_at)
    noise, sampling, worker = np.random.SeedSequence(seed, spawn_key=key).generate_state(3, dtype=np.uint64)
    return int(noise), int(sampling), int(worker)
