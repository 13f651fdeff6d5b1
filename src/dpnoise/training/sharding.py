"""Models sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``): what private training needs to know.

Under ``fully_shard`` every parameter is a DTensor sharded on dimension 0 over the ranks (``Shard(0)``);
each rank holds one chunk, its optimizer state likewise.  Each rank runs its forward and backward passes on
its own local batch with the full parameters, all-gathered layer by layer, so book-keeping sees every
layer's full input and output gradient for the rank's own examples and computes their per-example norms
and clipped sum over the full (unsharded) parameters: exactly one process's numbers for those examples.
The book-kept layers leave no parameter gradient for FSDP to reduce-scatter; instead the ranks' full
clipped sums, each with its noise share, are all-reduced as in an unsharded run, and each rank keeps the
chunk of the update its parameter shard needs (:func:`parameter_gradient`).  The update of every shard is
then the one a single process computes from the union of the ranks' batches (docs/DISTRIBUTED.md).

This module holds the small pieces the engine, book-keeping and the optimizers share: which parameters
are sharded, full-shape buffers for them, the gradient a shard takes, the layer type under FSDP's wrapper
class, and the checks that refuse what is not exact (:func:`sharded_model_problems`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

#: the one placement supported: FSDP2's sharding on dimension 0 over a 1-D mesh of every rank
FSDP_PLACEMENTS = (Shard(0),)


def is_sharded(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DTensor (a parameter of a ``fully_shard`` model)."""
    return isinstance(p, DTensor)


def sharded_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every DTensor parameter of ``module`` (empty: the model is not sharded)."""
    return [(name, p) for name, p in module.named_parameters() if is_sharded(p)]


def full_zeros(p: torch.Tensor) -> torch.Tensor:
    """Plain zeros of ``p``'s full (global) shape, dtype and device: a clipped sum's shape, also for a shard."""
    return torch.zeros(p.shape, dtype=p.dtype, device=p.device)


def full_like(p: torch.Tensor) -> torch.Tensor:
    """``p`` itself, or for a shard an uninitialised plain tensor of its full shape (a collective's template)."""
    return torch.empty(p.shape, dtype=p.dtype, device=p.device) if is_sharded(p) else p


def parameter_gradient(p: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """The gradient ``p`` takes from the full-shape gradient ``full``, which every rank holds alike: ``full``
    itself, or for a shard a copy of this rank's chunk of it, cut as the shard is (no communication)."""
    if not is_sharded(p):
        return full
    chunk = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
    # the chunk is a view of ``full``: copied, so that the full tensor is freed instead of living on in p.grad
    return DTensor.from_local(chunk.to_local().clone(), p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def layer_type(layer: nn.Module) -> type:
    """The layer's own class: ``fully_shard`` swaps a module's class for a subclass of ``FSDPModule`` and it
    (``FSDPLinear``), whose per-example gradients are the wrapped class's."""
    if not isinstance(layer, FSDPModule):
        return type(layer)
    return next(cls for cls in type(layer).__mro__[1:] if not issubclass(cls, FSDPModule))


def sharded_model_problems(module: nn.Module, world_size: Optional[int], *, needs_per_sample_gradients: bool,
                           grad_sample_mode: str, per_example_check: bool,
                           max_physical_batch_size: Optional[int], keyword_batches: bool,
                           unruled_layers: list[str]) -> list[str]:
    """Why ``module``'s sharded parameters cannot train privately here, one line each (empty: they can, or none
    is sharded).  ``world_size``: the process group's (None: no group of 2 or more ranks);
    ``unruled_layers``: ``"<path> (<type>)"`` of the trainable layers without a book-keeping rule."""
    sharded = sharded_parameters(module)
    if not sharded:
        return []
    problems = [f"parameter {name} is a DTensor placed as {tuple(p.placements)} on a mesh of {p.device_mesh.size()} "
                f"ranks: only fully_shard's {FSDP_PLACEMENTS} over every rank of the process group is supported"
                for name, p in sharded
                if tuple(p.placements) != FSDP_PLACEMENTS or p.device_mesh.ndim != 1
                or p.device_mesh.size() != world_size]
    if world_size is None:
        problems.append("a fully_shard model needs an initialised process group of 2 or more ranks")
    if not needs_per_sample_gradients:
        problems.append("the output mechanisms all-reduce the model's own gradients, which FSDP has already "
                        "reduce-scattered into shards: use a gradient mechanism (gaussian, lap2, laplace-l1)")
        return problems
    if grad_sample_mode == "hooks":
        problems.append("grad_sample_mode='hooks': Opacus's hooks keep per-example gradients on the parameters, "
                        "which FSDP reshards after the backward pass; use 'bookkeeping'")
    problems.extend(f"{layer}: no book-keeping rule; under fully_shard only layers with a rule (Linear, "
                    f"LayerNorm, Embedding, Hugging Face's Conv1D) are supported, their per-example gradients "
                    f"computed from full layer inputs and output gradients" for layer in unruled_layers)
    if per_example_check:
        problems.append("per_example_check=True: the check re-runs the model on a few of each rank's examples, "
                        "a number of forward passes that differs between ranks, which FSDP's all-gathers cannot "
                        "pair; check the unsharded model with dpnoise.training.check_per_example first and give "
                        "per_example_check=False")
    if max_physical_batch_size is not None:
        problems.append("max_physical_batch_size: the ranks would take different numbers of physical batches per "
                        "step, whose forward passes FSDP's all-gathers cannot pair")
    if keyword_batches:
        problems.append("dict batches: an empty local batch skips the model's forward pass (train_step), which "
                        "leaves the other ranks' all-gathers unpaired; give (inputs, targets) batches")
    return problems
