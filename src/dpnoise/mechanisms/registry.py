"""Torch implementations of the registered mechanisms.

What a mechanism is (noise unit, what it perturbs, clipping norm, accountants) is stated once, in
the torch-free registry :data:`dpnoise.accounting.MECHANISMS`.  This module adds how it runs: a
gradient mechanism (``perturbs == "gradients"``) adds noise of its ``noise_distribution`` to the
sum of clipped per-example gradients (:data:`NOISE_SAMPLERS`), with nothing to register here; an
output mechanism needs a module wrapper whose training-mode forward perturbs each example's output,
attached by :func:`implement_mechanism`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from dpnoise.accounting import MECHANISMS as SPECS
from dpnoise.accounting import InvalidParameterError, MechanismSpec, get_mechanism_spec
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.noise import gaussian_noise, laplace_noise

#: (reference tensor, noise, clip, generator, shares) -> noise tensor shaped like the reference: one of
#: ``shares`` independent shares whose sum is the mechanism's noise (the whole noise for ``shares=1``).
NoiseSampler = Callable[[torch.Tensor, float, float, Optional[torch.Generator], int], torch.Tensor]
#: (module, the mechanism's event, clip=, generator=) -> wrapped module.
ModuleWrapper = Callable[..., nn.Module]


@dataclass(frozen=True)
class Mechanism:
    """A registered mechanism (:attr:`spec`) with its torch implementation."""

    spec: MechanismSpec
    #: noise on the sum of clipped gradients (gradient mechanisms)
    sample_noise: Optional[NoiseSampler] = None
    #: wraps the model so its training-mode forward applies the mechanism (output mechanisms)
    wrap_module: Optional[ModuleWrapper] = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def clip_norm_ord(self) -> Optional[int]:
        return self.spec.clip_norm_ord

    @property
    def needs_per_sample_gradients(self) -> bool:
        return self.spec.needs_per_sample_gradients


#: the noise on the sum of clipped gradients, by the mechanism's ``noise_distribution``
NOISE_SAMPLERS: dict[str, NoiseSampler] = {"gaussian": gaussian_noise, "laplace": laplace_noise}
#: whether each sampler's noise is an absolute scale (the Laplace b), not a multiple of C (sigma): a
#: mechanism's noise unit (``NoiseParameter.per_clip``) must agree, or its noise would not be the one accounted
SAMPLER_TAKES_ABSOLUTE_SCALE = {"gaussian": False, "laplace": True}
_IMPLEMENTED: dict[str, Mechanism] = {}


def _not_runnable(spec: MechanismSpec) -> Optional[str]:
    """Why ``spec`` has no torch implementation (None: it has one)."""
    implemented = _IMPLEMENTED.get(spec.name)
    if implemented is not None and implemented.spec is spec:
        return None
    if spec.perturbs == "outputs":
        return "an output mechanism needs its module wrapper: implement_mechanism(name, wrap_module=...)"
    if spec.noise_distribution not in NOISE_SAMPLERS:
        return (f"no noise sampler for {spec.noise_distribution!r} (samplers: {', '.join(NOISE_SAMPLERS)}); "
                f"implement_mechanism(name, sample_noise=...)")
    if SAMPLER_TAKES_ABSOLUTE_SCALE[spec.noise_distribution] != spec.noise.per_clip:
        return (f"its noise {spec.noise.keyword!r} ({spec.noise.unit}) is not in the unit of the "
                f"{spec.noise_distribution} sampler; implement_mechanism(name, sample_noise=...)")
    return None


def _runnable(spec: MechanismSpec) -> Optional[Mechanism]:
    if _not_runnable(spec) is not None:
        return None
    implemented = _IMPLEMENTED.get(spec.name)
    if implemented is not None and implemented.spec is spec:
        return implemented
    return Mechanism(spec, sample_noise=NOISE_SAMPLERS[spec.noise_distribution])


class _Mechanisms(Mapping):
    """Every registered mechanism that can run, by name, in registration order: the gradient mechanisms
    whose noise law has a sampler and the output mechanisms with a module wrapper (a live view of
    :data:`dpnoise.accounting.MECHANISMS`: a mechanism registered later appears here too)."""

    def __getitem__(self, name: str) -> Mechanism:
        spec = SPECS.get(name)
        mechanism = None if spec is None else _runnable(spec)
        if mechanism is None:
            raise KeyError(name)
        return mechanism

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, spec in SPECS.items() if _runnable(spec) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


RUNNABLE_MECHANISMS: Mapping[str, Mechanism] = _Mechanisms()


def implement_mechanism(name: str, *, sample_noise: Optional[NoiseSampler] = None,
                        wrap_module: Optional[ModuleWrapper] = None) -> Mechanism:
    """Attach the torch implementation of the registered mechanism ``name`` (once): the module wrapper
    of an output mechanism, or a gradient mechanism's own noise sampler (instead of its law's)."""
    try:
        spec = get_mechanism_spec(name)
    except InvalidParameterError as err:
        raise InvalidMechanismError(f"{err}; register it in dpnoise.accounting.MECHANISMS first") from None
    if name in _IMPLEMENTED and _IMPLEMENTED[name].spec is spec:
        raise InvalidMechanismError(f"mechanism {name!r} is already implemented")
    if spec.perturbs == "gradients" and (sample_noise is None or wrap_module is not None):
        raise InvalidMechanismError(f"gradient mechanism {name!r} needs a noise sampler (and no module wrapper)")
    if spec.perturbs == "outputs" and (wrap_module is None or sample_noise is not None):
        raise InvalidMechanismError(f"output mechanism {name!r} needs a module wrapper (and no noise sampler)")
    _IMPLEMENTED[name] = Mechanism(spec, sample_noise, wrap_module)
    return _IMPLEMENTED[name]


def unimplement_mechanism(name: str) -> None:
    """Undo :func:`implement_mechanism` (a mechanism added for a test or a session)."""
    _IMPLEMENTED.pop(name, None)


def get_mechanism(name: str) -> Mechanism:
    """The implemented mechanism ``name``; a clear error lists the known ones."""
    try:
        return RUNNABLE_MECHANISMS[name]
    except KeyError:
        if name in SPECS:
            raise InvalidMechanismError(f"mechanism {name!r} cannot run: {_not_runnable(SPECS[name])}") from None
        raise InvalidMechanismError(f"unknown mechanism {name!r}; known: {', '.join(sorted(RUNNABLE_MECHANISMS))}") from None
