"""Devices of a private run: which device, generators on it, and batches moved to it.

``device="auto"`` is CUDA when torch sees a GPU, else the CPU.  The model, the batches, the
per-example clipping, the noise and the Poisson sampler's draws all live on the run's device; the
engine's generators are created there (a CUDA generator draws other numbers than a CPU generator
with the same seed, so a run on a GPU is reproducible on GPUs, not bit-identical to a CPU run).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from dpnoise.training.batches import map_tensors
from dpnoise.training.execution import DEVICE_CHOICES
from dpnoise.training.errors import InvalidTrainingOptionError

DeviceLike = Union[str, torch.device]


def resolve_device(device: DeviceLike, *, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``: "auto" is "cuda" when available, else "cpu".

    Raises :class:`InvalidTrainingOptionError` (naming ``name``) for a device torch does not know
    or a CUDA device on a machine without one.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidTrainingOptionError(
            f"{name} must be one of {', '.join(DEVICE_CHOICES)} or a torch device, got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InvalidTrainingOptionError(f"{name} {device!r}: no CUDA device is available on this machine "
                                         f"(use 'cpu' or 'auto')")
    if resolved.type not in ("cpu", "cuda"):
        raise InvalidTrainingOptionError(f"{name} must be a CPU or CUDA device, got {device!r}")
    return resolved


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for a module without parameters)."""
    first = next(module.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def module_float_dtype(module: torch.nn.Module) -> Optional[torch.dtype]:
    """The dtype of ``module``'s first floating-point parameter (batches are cast to it), if any."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def seeded_generator(seed: int, device: DeviceLike = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


def to_device(batch: Any, device: torch.device, float_dtype: Optional[torch.dtype] = None) -> Any:
    """``batch`` (tensors, possibly nested in lists, tuples and dicts) on ``device``; floating-point
    tensors also cast to ``float_dtype`` when given (integer tensors such as labels and token ids
    keep theirs)."""
    def move(tensor: torch.Tensor) -> torch.Tensor:
        dtype = float_dtype if float_dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.to(device=device, dtype=dtype, non_blocking=True)

    return map_tensors(batch, move)
