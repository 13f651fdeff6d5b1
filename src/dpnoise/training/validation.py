"""Checks before private training: every layer must keep examples separate, the optimizer trains the
model's own trainable parameters, and every argument of a private run (:func:`check_private_run`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from collections.abc import Hashable, Sequence
from typing import Any, Optional

import torch
from opacus.utils.module_utils import trainable_modules
from opacus.validators import ModuleValidator
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from dpnoise.accounting.validation import check_sample_rate
from dpnoise.mechanisms.registry import Mechanism, get_mechanism
from dpnoise.training.batches import (
    LossFunction,
    check_batch_format,
    check_loss_fn,
    first_example_batch,
    is_keyword_batch,
    keyword_batch_rules,
)
from dpnoise.training.bookkeeping import layer_path
from dpnoise.training.bookkeeping_rules import bookkeeping_rule
from dpnoise.training.devices import module_device, resolve_device
from dpnoise.training.distributed import RankGroup, current_group
from dpnoise.training.errors import (
    InvalidTrainingOptionError,
    UncheckedPerExampleGradientsWarning,
    UnsupportedLayerError,
)
from dpnoise.training.execution import ExecutionOptions
from dpnoise.training.per_example_check import refuse_token_mean_lm_loss
from dpnoise.training.privacy_plan import PrivacyOptions, check_step_count
from dpnoise.training.privacy_units import PrivacyUnits
from dpnoise.training.secure_mode import check_secure_mode
from dpnoise.training.sharding import sharded_model_problems, sharded_parameters
from dpnoise.training.grad_samplers import per_example_gradient_problems


def unsupported_layer_reasons(module: nn.Module, *, needs_per_sample_gradients: bool) -> list[str]:
    """One line per unsupported layer: ``"<path> (<type>): <why>"``; empty when the model is fine.

    Batch normalisation is always refused: its batch statistics make each example's output depend
    on the other examples in the batch, which no per-example mechanism accounts for.  For gradient
    mechanisms, trainable layers with buffers, layers whose exact per-example gradients neither gradient
    source computes (:func:`~dpnoise.training.grad_samplers.per_example_gradient_problems`: ``nn.RNN``,
    ``nn.LSTM``, ``nn.GRU``, ``nn.MultiheadAttention``, embeddings with ``max_norm`` or ``scale_grad_by_freq``) and layers Opacus's
    validators reject are refused too.
    """
    reasons = []
    for name, layer in module.named_modules():
        path = name or "<model>"
        if isinstance(layer, _BatchNorm):
            reasons.append(
                f"{path} ({type(layer).__name__}): batch statistics mix examples; use GroupNorm or LayerNorm "
                f"(dpnoise.layers.fix_model(model) swaps BatchNorm for GroupNorm), or, with pretrained statistics, "
                f"freeze it as a per-channel affine map that trains: dpnoise.models.freeze_batchnorms(model)"
            )
    if needs_per_sample_gradients:
        for name, layer in trainable_modules(module):
            if isinstance(layer, _BatchNorm):
                continue
            path = name or "<model>"
            if any(True for _ in layer.buffers(recurse=False)):
                reasons.append(f"{path} ({type(layer).__name__}): trainable layer with buffers")
            problems = per_example_gradient_problems(layer)
            validator = ModuleValidator.VALIDATORS.get(type(layer))
            if validator is not None and not problems:  # Opacus's message for nn.LSTM would repeat ours
                problems = [str(error) for error in validator(layer)]
            reasons.extend(f"{path} ({type(layer).__name__}): {problem}" for problem in problems)
    return reasons


def check_supported_layers(module: nn.Module, *, needs_per_sample_gradients: bool) -> None:
    """Raise :class:`UnsupportedLayerError` naming every unsupported layer of ``module``."""
    reasons = unsupported_layer_reasons(module, needs_per_sample_gradients=needs_per_sample_gradients)
    if reasons:
        raise UnsupportedLayerError("unsupported layers for private training:\n  " + "\n  ".join(reasons))


def check_optimizer_trains(module: nn.Module, optimizer: Optimizer) -> None:
    """Raise :class:`InvalidTrainingOptionError` unless ``optimizer`` trains ``module``'s trainable parameters.

    Refused before any step: a model without trainable parameters (nothing to train, no gradient to
    clip); an optimizer holding a tensor that is not a parameter of ``module`` (e.g. another
    model's: it would never see the clipped, noised gradients); an optimizer over none of the
    trainable ones.  Frozen parameters of ``module`` may be in it (torch and Opacus skip them).
    """
    if not isinstance(module, nn.Module):
        raise InvalidTrainingOptionError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise InvalidTrainingOptionError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    parameters = {id(p): p.requires_grad for p in module.parameters()}
    if not any(parameters.values()):
        raise InvalidTrainingOptionError("module has no trainable parameters (none with requires_grad=True): "
                                         "nothing to train privately")
    held = [id(p) for group in optimizer.param_groups for p in group["params"]]
    foreign = sum(1 for p in held if p not in parameters)
    if foreign:
        raise InvalidTrainingOptionError(
            f"optimizer holds {foreign} tensor(s) that are not parameters of module (another model's?); "
            f"create it over the module's parameters, e.g. torch.optim.SGD(module.parameters(), ...)")
    if not any(parameters[p] for p in held):
        raise InvalidTrainingOptionError("optimizer holds none of module's trainable parameters (requires_grad=True)")


def check_training_mode(module: nn.Module, *, needs_per_sample_gradients: bool) -> None:
    """Refuse a model in eval mode (and, for gradient mechanisms, any trainable layer in it).

    Per-example gradients are recorded in training-mode forward passes only, and dropout is off in
    eval mode; Hugging Face's ``from_pretrained`` returns models in eval mode.
    """
    layers = trainable_modules(module) if needs_per_sample_gradients else []
    in_eval = [name or "<model>" for name, layer in [("", module), *layers] if not layer.training]
    if in_eval:
        listed = ", ".join(dict.fromkeys(in_eval[:4])) + (", ..." if len(in_eval) > 4 else "")
        raise InvalidTrainingOptionError(
            f"the model is in eval mode ({listed}): call model.train() before make_private (from_pretrained "
            f"returns models in eval mode, in which no per-example gradient is recorded)")


def check_sharded_model(module: nn.Module, group: Optional[RankGroup], mechanism: Mechanism,
                        execution: ExecutionOptions, data_loader: DataLoader) -> None:
    """Raise :class:`UnsupportedLayerError` naming each reason a ``fully_shard`` model (DTensor parameters)
    cannot train exactly in this run (:func:`~dpnoise.training.sharding.sharded_model_problems`); nothing for
    an unsharded model."""
    if not sharded_parameters(module):
        return
    keyword_batches = is_keyword_batch(first_example_batch(data_loader))
    problems = sharded_model_problems(
        module, None if group is None else group.world_size,
        needs_per_sample_gradients=mechanism.needs_per_sample_gradients,
        grad_sample_mode=execution.grad_sample_mode, per_example_check=execution.per_example_check,
        max_physical_batch_size=execution.max_physical_batch_size, keyword_batches=keyword_batches,
        unruled_layers=[layer_path(name, layer) for name, layer in trainable_modules(module)
                        if bookkeeping_rule(layer) is None])
    if problems:
        raise UnsupportedLayerError("this fully_shard (FSDP2) model cannot train privately:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class CheckedRun:
    """What the checks of a private run found out: where it runs, with whom, under which mechanism, and how
    its keyword batches are checked."""

    device: torch.device
    group: Optional[RankGroup]
    mechanism: Mechanism
    batch_rules: Any
    #: the privacy units of the data set (None: each example is its own)
    units: Optional[PrivacyUnits] = None


def check_private_run(module: nn.Module, optimizer: Optimizer, data_loader: DataLoader, *, privacy: PrivacyOptions,
                      execution: ExecutionOptions, loss_fn: Optional[LossFunction],
                      noise_seed: Optional[int], privacy_unit: Optional[Sequence[Hashable]] = None) -> CheckedRun:
    """Every argument of :meth:`~dpnoise.training.PrivacyEngine.make_private_with_options` checked, before any
    work (errors name the parameter); ``noise_seed`` is the engine's (secure mode refuses one)."""
    if not isinstance(privacy, PrivacyOptions):
        raise InvalidTrainingOptionError(f"privacy must be a PrivacyOptions, got a {type(privacy).__name__}")
    if not isinstance(execution, ExecutionOptions):
        raise InvalidTrainingOptionError(f"execution must be an ExecutionOptions, got a {type(execution).__name__}")
    check_loss_fn(loss_fn)
    check_optimizer_trains(module, optimizer)
    device = module_device(module) if execution.device is None else resolve_device(execution.device)
    group = current_group(device)
    poisson_sampling = execution.poisson_sampling
    if not poisson_sampling and (group is not None or device.type != "cpu"):
        raise InvalidTrainingOptionError("poisson_sampling=False (shuffled batches, not covered by the "
                                         "accountants) is only available in one process on the CPU")
    mech = get_mechanism(privacy.mechanism)
    if data_loader.batch_size is None:
        raise InvalidTrainingOptionError("the data loader needs a batch_size (the expected batch size)")
    if len(data_loader.dataset) == 0:
        raise InvalidTrainingOptionError("the data loader's dataset is empty")
    units = None if privacy_unit is None else PrivacyUnits(privacy_unit, len(data_loader.dataset))
    if units is None:
        check_step_count(privacy.epochs, check_sample_rate("data_loader.batch_size / len(dataset)",
                                                           data_loader.batch_size / len(data_loader.dataset)))
    else:
        check_privacy_units(mech, group, execution, privacy.clipping)
        check_step_count(privacy.epochs, check_sample_rate("data_loader.batch_size / (number of privacy units)",
                                                           data_loader.batch_size / units.count))
    batch_rules = keyword_batch_rules(module)
    check_batch_format(data_loader, perturbs_gradients=mech.needs_per_sample_gradients, rules=batch_rules)
    check_training_mode(module, needs_per_sample_gradients=mech.needs_per_sample_gradients)
    check_supported_layers(module, needs_per_sample_gradients=mech.needs_per_sample_gradients)
    if mech.needs_per_sample_gradients:
        refuse_token_mean_lm_loss(module, loss_fn)
        if not execution.per_example_check:
            warnings.warn("per_example_check=False: nothing checks that each example's clipped gradient is its "
                          "own; a layer input without a batch dimension, a loss averaged over the batch's tokens "
                          "or batch statistics would break the epsilon without a word",
                          UncheckedPerExampleGradientsWarning, stacklevel=4)
    check_secure_mode(privacy.secure_mode, mech, group, poisson_sampling, module, noise_seed)
    check_sharded_model(module, group, mech, execution, data_loader)
    return CheckedRun(device=device, group=group, mechanism=mech, batch_rules=batch_rules, units=units)


def check_privacy_units(mechanism: Mechanism, group: Optional[RankGroup], execution: ExecutionOptions,
                        clipping: str) -> None:
    """Refuse what privacy units do not support yet: output mechanisms (whose sensitivity is per example),
    process groups (the shards split units), physical batches (they may split a unit) and adaptive clipping
    (its count is over the expected examples)."""
    if clipping == "adaptive":
        raise InvalidTrainingOptionError("privacy_unit with clipping adaptive is not supported: its quantile is "
                                         "estimated per example; use flat or automatic clipping")
    if not mechanism.needs_per_sample_gradients:
        raise InvalidTrainingOptionError(f"privacy_unit: mechanism {mechanism.name!r} noises each example's outputs; "
                                         f"privacy units need a gradient mechanism (a unit's gradient clipped as one)")
    if group is not None:
        raise InvalidTrainingOptionError("privacy_unit is not supported in a process group (each rank's shard would "
                                         "split units): train in one process")
    if execution.max_physical_batch_size is not None:
        raise InvalidTrainingOptionError("privacy_unit with max_physical_batch_size: a physical batch may split a "
                                         "unit, whose gradient must be clipped whole; leave max_physical_batch_size "
                                         "unset")
    if not execution.poisson_sampling:
        raise InvalidTrainingOptionError("privacy_unit needs poisson_sampling=True (units are Poisson-sampled)")
