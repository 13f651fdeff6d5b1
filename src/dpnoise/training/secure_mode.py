"""Secure mode on the torch side: where it holds (checked before any work), its grid and integer noise
for a run's trainable coordinates, and what the run records of it.

The release itself is a :class:`~dpnoise.mechanisms.release.GridRelease`; the accountants learn of it from the
step's :class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent` (docs/theory/secure_noise.md).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from dpnoise.accounting.secure_noise import DiscreteGaussianPlan, plan_discrete_gaussian, plan_discrete_laplace
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.mechanisms.registry import Mechanism
from dpnoise.mechanisms.secure_noise import Plan
from dpnoise.training.distributed import RankGroup
from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.privacy_plan import SECURE_MODE_MECHANISMS, PrivacySetup


def check_secure_mode(secure_mode: bool, mech: Mechanism, group: Optional[RankGroup], poisson_sampling: bool,
                      module: nn.Module, noise_seed: Optional[int]) -> None:
    """Refuse ``secure_mode`` where it does not hold (before any work)."""
    if not secure_mode:
        return
    if mech.spec.secure_noise is None:
        raise InvalidTrainingOptionError(
            f"secure_mode serves the gradient mechanisms {', '.join(SECURE_MODE_MECHANISMS)}; {mech.name!r} is "
            f"not covered (its noise is drawn in the model's forward pass, by torch's generator)")
    if noise_seed is not None:
        raise InvalidTrainingOptionError(
            "secure_mode draws its noise from the operating system's cryptographically secure generator, which "
            "nobody can reproduce; it cannot be combined with the engine's noise_seed")
    if group is not None:
        raise InvalidTrainingOptionError(
            f"secure_mode is not supported in a process group of {group.world_size} ranks yet (the noise_shares "
            f"modes add noise shares on every rank, not one grid release of the total); train in one process")
    if not poisson_sampling:
        raise InvalidTrainingOptionError("secure_mode needs poisson_sampling=True (the accountants' sampling)")
    for name, parameter in module.named_parameters():
        if parameter.requires_grad and not parameter.is_floating_point():
            raise InvalidTrainingOptionError(
                f"secure_mode releases real floating-point gradients; parameter {name!r} is {parameter.dtype}")

def secure_noise_plan(setup: PrivacySetup, mech: Mechanism, module: nn.Module) -> Plan:
    """Secure mode's plan for the setup's noise, clip and n trainable coordinates (the rounding
    bound covers all of them), after checking that every trainable dtype holds its grid."""
    try:
        if mech.spec.secure_noise == "discrete-gaussian":
            plan = plan_discrete_gaussian(setup.noise, setup.clip, setup.params)
        else:
            plan = plan_discrete_laplace(setup.noise, setup.clip, setup.params, mech.clip_norm_ord)
    except InvalidParameterError as err:
        raise InvalidTrainingOptionError(f"secure_mode: {err}") from None
    grid = plan.rounding.grid
    for name, parameter in module.named_parameters():
        if not parameter.requires_grad:
            continue
        info = torch.finfo(parameter.dtype)
        if grid < info.smallest_normal * info.eps:
            raise InvalidTrainingOptionError(
                f"secure_mode releases multiples of the grid {grid:.6g}, which parameter {name!r} "
                f"({parameter.dtype}, smallest positive value {info.smallest_normal * info.eps:.6g}) cannot "
                f"hold; train in float32, or raise max_grad_norm (the grid is about 2^-10 C / sqrt(n))")
    return plan

def secure_noise_record(plan: Plan) -> dict[str, Any]:
    """Secure mode's release for the records: the sampler, the grid, the rounding-inflated clip C' and the
    factor C'/C the noise was raised by, and the noise in use (Laplace: the absolute scale t * grid;
    Gaussian: the standard deviation grid sqrt(t w))."""
    gaussian = isinstance(plan, DiscreteGaussianPlan)
    return {
        "sampler": "discrete gaussian" if gaussian else "floored laplace",
        "random_bytes": "os.urandom",
        "grid": plan.rounding.grid,
        "inflated_clip": plan.rounding.inflated_clip,
        "inflation": plan.rounding.inflation,
        "noise_in_use": plan.noise_std if gaussian else plan.noise_scale,
    }


__all__ = ["check_secure_mode", "secure_noise_plan", "secure_noise_record"]
