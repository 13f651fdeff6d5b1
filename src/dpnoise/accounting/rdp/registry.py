"""RDP of each DP event, by event type: a registry so that new mechanisms plug in.

``register_rdp(EventType)`` registers ``fn(event, q, orders, methods) -> rdp`` giving the RDP of
``event`` applied to a Poisson subsample with rate ``q`` (q = 1: no subsampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Literal

import numpy as np

from dpnoise.accounting.events import (
    ComposedEvent,
    DirichletEvent,
    DpEvent,
    GaussianEvent,
    Lap2Event,
    LaplaceEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)
from dpnoise.accounting.rdp.curve import checked_rdp_curve
from dpnoise.accounting.rdp.dirichlet import (
    DirichletBase,
    DirichletSubsampling,
    sampled_dirichlet_rdp,
)
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp, shared_inclusion_gaussian_rdp
from dpnoise.accounting.rdp.lap2 import lap2_add_only_rdp, lap2_paper_rdp, lap2_sound_rdp
from dpnoise.accounting.rdp.laplace import sampled_laplace_rdp

Lap2Method = Literal["sound", "paper", "add-only"]
#: "add-remove": the noisy sum of a batch (DP-SGD); "replace-one": each sampled example's own noisy
#: output released (the penultimate-layer baseline), replace-one adjacency
GaussianRelease = Literal["add-remove", "replace-one"]


@dataclass(frozen=True)
class AccountingMethods:
    """Which bound to use where a mechanism has several (defaults: the proven ones)."""

    lap2: Lap2Method = "sound"
    gaussian_release: GaussianRelease = "add-remove"
    dirichlet_base: DirichletBase = "exact-vertex"
    dirichlet_subsampling: DirichletSubsampling = "replace-one"


RdpFunction = Callable[[object, float, np.ndarray, AccountingMethods], np.ndarray]
_RDP_FUNCTIONS: dict[type, RdpFunction] = {}


def register_rdp(event_type: type) -> Callable[[RdpFunction], RdpFunction]:
    """Decorator registering the (subsampled) RDP function of a mechanism event type."""

    def decorator(fn: RdpFunction) -> RdpFunction:
        _RDP_FUNCTIONS[event_type] = fn
        return fn

    return decorator


@register_rdp(GaussianEvent)
def _gaussian(event: GaussianEvent, q: float, orders: np.ndarray, methods: AccountingMethods) -> np.ndarray:
    if methods.gaussian_release == "replace-one":
        return shared_inclusion_gaussian_rdp(q, event.noise_multiplier, orders)
    return sampled_gaussian_rdp(q, event.noise_multiplier, orders)


@register_rdp(LaplaceEvent)
def _laplace(event: LaplaceEvent, q: float, orders: np.ndarray, _: AccountingMethods) -> np.ndarray:
    return sampled_laplace_rdp(q, event.noise_multiplier, orders)


@register_rdp(Lap2Event)
def _lap2(event: Lap2Event, q: float, orders: np.ndarray, methods: AccountingMethods) -> np.ndarray:
    fn = {"sound": lap2_sound_rdp, "paper": lap2_paper_rdp, "add-only": lap2_add_only_rdp}
    return fn[methods.lap2](q, event.noise_multiplier, event.num_params, orders)


@register_rdp(DirichletEvent)
def _dirichlet(
    event: DirichletEvent, q: float, orders: np.ndarray, methods: AccountingMethods
) -> np.ndarray:
    return sampled_dirichlet_rdp(
        q, event.r, event.alpha, orders, methods.dirichlet_base, methods.dirichlet_subsampling
    )


@lru_cache(maxsize=256)
def _mechanism_rdp(
    event: DpEvent, q: float, orders: tuple[float, ...], methods: AccountingMethods
) -> np.ndarray:
    fn = _RDP_FUNCTIONS.get(type(event))
    if fn is None:
        raise NotImplementedError(f"no RDP accountant registered for {type(event).__name__}")
    out = checked_rdp_curve(orders, fn(event, q, np.asarray(orders), methods), f"{event} at q={q:g}")
    out.setflags(write=False)
    return out


def event_rdp(event: DpEvent, orders: np.ndarray, methods: AccountingMethods) -> np.ndarray:
    """RDP curve (Renyi divergence at each order) of an arbitrary composed / subsampled event."""
    key = tuple(float(a) for a in np.asarray(orders, dtype=float))
    if isinstance(event, PoissonSampledEvent):
        if type(event.event) not in _RDP_FUNCTIONS:
            raise NotImplementedError(f"no RDP accountant registered for {type(event.event).__name__} (Poisson "
                                      f"sampling is accounted around a single mechanism event)")
        return _mechanism_rdp(event.event, event.sampling_probability, key, methods)
    if isinstance(event, SelfComposedEvent):
        if event.count == 0:
            return np.zeros(len(key))
        return event.count * event_rdp(event.event, orders, methods)
    if isinstance(event, ComposedEvent):
        return sum((event_rdp(e, orders, methods) for e in event.events), np.zeros(len(key)))
    return _mechanism_rdp(event, 1.0, key, methods)
