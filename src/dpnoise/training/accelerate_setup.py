"""The ``accelerate`` setups in which dpnoise's private objects train as they are.

``accelerator.prepare(module, optimizer, loader)`` leaves the private module and loader as they are
(:mod:`dpnoise.prepared`): each rank's loader draws its shard of every Poisson batch and the private
optimizer all-reduces the noisy clipped sums, so that the update and the epsilon are one process's
(docs/DISTRIBUTED.md).  The optimizer is wrapped by accelerate as usual (its step passes through).  What
accelerate would have added to the module or loader, and dpnoise does not do, is refused here, at
``prepare()``, naming the setting: :func:`check_accelerate_setup`.
"""

from __future__ import annotations

import torch

from dpnoise.training.errors import InvalidTrainingOptionError

#: accelerate's distributed types served by dpnoise's own process group: one process, or K processes of
#: ``torch.distributed`` on CPUs (gloo) or CUDA GPUs (nccl)
SERVED_DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU")


def check_accelerate_setup(device: torch.device, world_size: int) -> None:
    """Raise :class:`InvalidTrainingOptionError` unless the running ``Accelerator`` is one that private
    objects made on ``device`` in a run of ``world_size`` processes serve without accelerate's wrappers.
    Outside an ``Accelerator`` there is nothing to check."""
    from accelerate.state import AcceleratorState, GradientState, is_initialized  # accelerate is calling

    if not is_initialized():
        return
    state = AcceleratorState()
    distributed = state.distributed_type.value
    problems = []
    if distributed not in SERVED_DISTRIBUTED_TYPES:
        problems.append(f"accelerate's distributed type {distributed}: dpnoise's private objects train in one "
                        f"process or in several processes of torch.distributed ({', '.join(SERVED_DISTRIBUTED_TYPES[1:])}"
                        f"); launch without DeepSpeed, FSDP or TPU settings (sharded models: fully_shard before "
                        f"make_private, docs/DISTRIBUTED.md)")
    if state.num_processes != world_size:
        problems.append(f"the private objects were made in a run of {world_size} process(es) but accelerate runs "
                        f"{state.num_processes}: create the Accelerator (it starts the process group) before calling "
                        f"make_private, on every process")
    if not same_device(device, state.device):
        problems.append(f"the private objects live on {device} but accelerator.device is {state.device}: call "
                        f"make_private(..., device=accelerator.device)")
    if state.mixed_precision != "no":
        problems.append(f"Accelerator(mixed_precision={state.mixed_precision!r}) is not applied to dpnoise's private "
                        f"module (dpnoise does not train in mixed precision): use mixed_precision='no'")
    accumulation = GradientState().num_steps
    if accumulation != 1:
        problems.append(f"Accelerator(gradient_accumulation_steps={accumulation}) would make one optimizer step of "
                        f"{accumulation} Poisson batches, a step the accountants do not describe: leave it at 1 "
                        f"(make_private(max_physical_batch_size=...) splits each Poisson batch into pieces for memory)")
    if problems:
        raise InvalidTrainingOptionError("accelerator.prepare() on dpnoise's private objects: " + "; ".join(problems))


def same_device(first: torch.device, second: torch.device) -> bool:
    """Whether two devices are one: a CUDA device without an index is the current one, and the CPU is one
    device whatever its index (accelerate names it ``cpu:0`` in several processes)."""
    def indexed(device: torch.device) -> torch.device:
        device = torch.device(device)
        if device.type == "cpu":
            return torch.device("cpu")
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    return indexed(first) == indexed(second)
