"""How the engine wraps a model for per-example gradients: book-keeping, or Opacus's hooks.

One place for what ``make_private`` does to a model of a gradient mechanism, so that whatever
checks the per-example gradients of a model (:func:`dpnoise.training.check_per_example`) checks
the ones training will use.  Both private modules can run their model unrecorded (``paused()``),
e.g. for a reference gradient by plain autograd.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import nn
from torch.optim import Optimizer

from dpnoise.mechanisms.clipping import AdaptiveClipping, ClippingRule, clipping_rule
from dpnoise.mechanisms.registry import Mechanism
from dpnoise.mechanisms.release import FloatRelease, GridRelease, Release
from dpnoise.mechanisms.secure_noise import Plan

from dpnoise.training.bookkeeping import (
    BookkeepingModule,
    check_layer_inputs,
    gradient_sources,
    unsupported_bookkeeping_layers,
)
from dpnoise.training.errors import GradientSourceWarning, InvalidTrainingOptionError
from dpnoise.training.execution import GradSampleMode, check_grad_sample_mode
from dpnoise.training.distributed import RankGroup
from dpnoise.training.forwarding import ModelForwarding
from dpnoise.training.grad_samplers import ExactGradSampleModule
from dpnoise.training.privacy_plan import PrivacySetup
from dpnoise.training.optimizers import (
    DistributedNoisyGradientOptimizer,
    DistributedOutputPrivateOptimizer,
    NoisyGradientOptimizer,
    OutputPrivateOptimizer,
    noise_share,
)


class HooksModule(ModelForwarding, ExactGradSampleModule):
    """The private module of ``grad_sample_mode="hooks"``: :class:`ExactGradSampleModule` for the
    batch-mean loss, gradient accumulation forbidden, every training call of a trainable layer
    checked (:func:`~dpnoise.training.bookkeeping.check_layer_inputs`)."""

    def __init__(self, module: nn.Module):
        layer_inputs = check_layer_inputs(module)
        super().__init__(module, loss_reduction="mean")
        self.forbid_grad_accumulation()
        self.layer_inputs = layer_inputs

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within: the wrapped model runs as if it were not wrapped (no per-example gradient recorded, no
        layer input checked or broadcast over the batch)."""
        hooks_enabled, inputs_paused = self.hooks_enabled, self.layer_inputs.paused
        self.disable_hooks()
        self.layer_inputs.paused = True
        try:
            yield
        finally:
            self.layer_inputs.paused = inputs_paused
            if hooks_enabled:
                self.enable_hooks()


PrivateModule = Union[BookkeepingModule, HooksModule]


def resolve_grad_sample_mode(module: nn.Module, grad_sample_mode: GradSampleMode) -> GradSampleMode:
    """``"bookkeeping"`` or ``"hooks"``: ``"auto"`` is book-keeping when every trainable layer of
    ``module`` supports it, else hooks (``make_private`` warns about the latter)."""
    check_grad_sample_mode(grad_sample_mode)
    if grad_sample_mode != "auto":
        return grad_sample_mode
    return "hooks" if unsupported_bookkeeping_layers(module) else "bookkeeping"


def wrap_for_per_example_gradients(module: nn.Module,
                                   grad_sample_mode: GradSampleMode) -> tuple[PrivateModule, GradSampleMode]:
    """The private module that computes ``module``'s per-example gradients (a :class:`BookkeepingModule`
    or a :class:`HooksModule`), and its mode (``"auto"`` resolved by :func:`resolve_grad_sample_mode`).
    Hooks are added to ``module`` itself."""
    grad_sample_mode = resolve_grad_sample_mode(module, grad_sample_mode)
    if grad_sample_mode == "bookkeeping":
        return BookkeepingModule(module), grad_sample_mode
    return HooksModule(module), grad_sample_mode


@dataclass(frozen=True)
class GradientSource:
    """Where a model's per-example gradients come from: the private module, its mode (``"bookkeeping"`` or
    ``"hooks"``) and each trainable layer's source (:func:`~dpnoise.training.bookkeeping.gradient_sources`)."""

    module: PrivateModule
    mode: GradSampleMode
    sources: dict[str, str]


def choose_gradient_source(module: nn.Module, grad_sample_mode: GradSampleMode) -> GradientSource:
    """``module`` wrapped for its per-example gradients in ``grad_sample_mode`` (``"auto"`` resolved by
    :func:`resolve_grad_sample_mode`, with a :class:`GradientSourceWarning` naming each layer book-keeping
    does not support where it falls back to the hooks)."""
    resolved = resolve_grad_sample_mode(module, grad_sample_mode)
    if grad_sample_mode == "auto" and resolved == "hooks":
        warnings.warn(
            "grad_sample_mode='auto': book-keeping does not support these layers, so the whole model's per-example "
            "gradients come from Opacus's hooks (exact as well; slower, and every layer's gradients materialised; "
            "engine.gradient_sources gives each layer's source, grad_sample_mode='hooks' chooses them without "
            "this warning):\n  " + "\n  ".join(unsupported_bookkeeping_layers(module)), GradientSourceWarning,
            stacklevel=5)
    sources = gradient_sources(module, resolved)
    private_module, _ = wrap_for_per_example_gradients(module, resolved)
    return GradientSource(private_module, resolved, sources)



def run_clipping(setup: PrivacySetup, group: Optional[RankGroup], expected_batch_size: float,
                 generator: torch.Generator) -> ClippingRule:
    """The run's per-example clipping rule: flat or automatic, or adaptive clipping's (an
    :class:`AdaptiveClipping`, whose C_t the engine checkpoints, its count noised from ``generator``)."""
    if setup.clipping != "adaptive":
        return clipping_rule(setup.clipping, setup.clip, setup.clipping_gamma)
    if group is not None:  # each rank would count and move C_t on its own share of the batch
        raise InvalidTrainingOptionError("clipping adaptive is not available in a process group: train in one process")
    return AdaptiveClipping(initial_clip=setup.clip, target_quantile=setup.target_quantile,
                            learning_rate=setup.clipping_lr, count_noise=setup.quantile_noise,
                            count_noise_law=setup.quantile_noise_law, expected_batch_size=expected_batch_size,
                            generator=generator)


def step_release(mechanism: Mechanism, noise: float, clip: float, generator: torch.Generator,
                 secure_plan: Optional[Plan], group: Optional[RankGroup], noise_shares: str) -> Release:
    """How each step's clipped sums are noised: secure mode's grid release (``secure_plan``), else the
    mechanism's float noise from ``generator`` (this rank's share of it in a process ``group``)."""
    if secure_plan is not None:
        return GridRelease(secure_plan)
    shares, adds_share = noise_share(group, noise_shares)
    return FloatRelease(mechanism.sample_noise, noise, clip, generator, shares, adds_share)


def wrap_private(module: nn.Module, optimizer: Optimizer, *, mechanism: Mechanism, event: Any, clip: float,
                 release: Optional[Release], expected_batch_size: float, grad_sample_mode: GradSampleMode, gate: Any,
                 clipping: Optional[ClippingRule] = None,
                 batches: Any, group: Optional[RankGroup], noise_shares: str, generator: Optional[torch.Generator],
                 ) -> tuple[nn.Module, Optimizer, Optional[GradientSource]]:
    """The private module and optimizer of a run, the distributed ones inside a process ``group``, and the
    gradient source (None for an output mechanism).  A gradient mechanism's module gets per-example
    gradients (:func:`choose_gradient_source`) and its optimizer clips, noises by ``release`` and steps
    through the ledger ``gate``; an output mechanism's module is wrapped by the mechanism with its per-step
    ``event`` (the noise is in the forward pass) and its optimizer only takes the batch and records the step."""
    if mechanism.needs_per_sample_gradients:
        source = choose_gradient_source(module, grad_sample_mode)
        options = dict(mechanism=mechanism, release=release, max_grad_norm=clip, expected_batch_size=expected_batch_size,
                       gate=gate, logical_batches=batches, clipping=clipping,
                       bookkeeping=source.module if source.mode == "bookkeeping" else None)
        if group is None:
            return source.module, NoisyGradientOptimizer(optimizer, **options), source
        return (source.module, DistributedNoisyGradientOptimizer(optimizer, group=group, noise_shares=noise_shares,
                                                                 **options), source)
    private_module = mechanism.wrap_module(module, event, clip=clip, generator=generator)
    options = dict(gate=gate, logical_batches=batches, module=private_module)
    if group is None:
        return private_module, OutputPrivateOptimizer(optimizer, **options), None
    return private_module, DistributedOutputPrivateOptimizer(optimizer, group=group, **options), None
