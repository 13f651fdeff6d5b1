"""RDP of each DP event, by event type and route: a registry that mechanism plugins fill.

A mechanism plugin (:mod:`dpnoise.accounting.plugins`) registers, for its event type, one or more
named RDP routes ``fn(event, q, orders) -> rdp``, each the RDP of ``event`` applied to a Poisson
subsample with rate ``q`` (q = 1: no subsampling).  The first route registered for a type is its
default; an accountant names another (``AccountantSpec.rdp_route``, e.g. the published Lap2 bound)
where a mechanism has several.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Optional

import numpy as np

from dpnoise.accounting.events import (
    ComposedEvent,
    DpEvent,
    PoissonSampledEvent,
    RepeatAndSelectEvent,
    SelfComposedEvent,
)
from dpnoise.accounting.rdp.composed import jointly_subsampled_rdp
from dpnoise.accounting.rdp.curve import checked_rdp_curve
from dpnoise.accounting.rdp.repeat_and_select import repeat_and_select_rdp
from dpnoise.accounting.validation import InvalidParameterError

RdpFunction = Callable[[Any, float, np.ndarray], np.ndarray]
#: an accountant's own event type and the name of the RDP route its events take (None: every event
#: its default route); events of other types (releases composed before training) take their default
RdpRoute = Optional[tuple[type, str]]
#: event type -> {route name: RDP function}, in registration order (the first is the default)
_RDP_ROUTES: dict[type, dict[str, RdpFunction]] = {}
#: the routes registered as not sound (faithful to a paper, not a proven bound), by event type
_UNSOUND_ROUTES: dict[type, set[str]] = {}


def register_rdp(event_type: type, route: str, sound: bool = True) -> Callable[[RdpFunction], RdpFunction]:
    """Decorator registering ``route``, an RDP function of the (Poisson-subsampled) ``event_type``;
    the first route of a type is its default.  ``sound``: whether the route is a proven upper bound
    (an accountant declared sound may only use a sound route).  A route already registered is refused."""

    def decorator(fn: RdpFunction) -> RdpFunction:
        routes = _RDP_ROUTES.setdefault(event_type, {})
        if route in routes:
            raise InvalidParameterError(f"RDP route {route!r} of {event_type.__name__} is already registered")
        if not routes and not sound:
            raise InvalidParameterError(f"RDP route {route!r} of {event_type.__name__} would be its default, which "
                                        f"must be sound")
        routes[route] = fn
        if not sound:
            _UNSOUND_ROUTES.setdefault(event_type, set()).add(route)
        _mechanism_rdp.cache_clear()
        return fn

    return decorator


def unregister_rdp(event_type: type, route: str) -> None:
    """Remove ``route`` of ``event_type`` (and the type, with its last route)."""
    routes = _RDP_ROUTES.get(event_type, {})
    routes.pop(route, None)
    _UNSOUND_ROUTES.get(event_type, set()).discard(route)
    if not routes:
        _RDP_ROUTES.pop(event_type, None)
        _UNSOUND_ROUTES.pop(event_type, None)
    _mechanism_rdp.cache_clear()


def rdp_route_is_sound(event_type: type, route: Optional[str]) -> bool:
    """Whether ``event_type``'s RDP route ``route`` (None: its default) was registered as sound."""
    return route is None or route not in _UNSOUND_ROUTES.get(event_type, set())


def rdp_routes(event_type: type) -> tuple[str, ...]:
    """The RDP routes registered for ``event_type``, the default first (empty: it has no RDP)."""
    return tuple(_RDP_ROUTES.get(event_type, ()))


def _route_function(event_type: type, route: RdpRoute) -> RdpFunction:
    """The RDP function of ``event_type``: ``route``'s where it names this type (an error if that route
    is not registered), else the type's default."""
    routes = _RDP_ROUTES.get(event_type)
    if not routes:
        raise NotImplementedError(f"no RDP accountant registered for {event_type.__name__}")
    if route is not None and route[0] is event_type:
        if route[1] not in routes:
            raise NotImplementedError(f"RDP route {route[1]!r} of {event_type.__name__} is not registered")
        return routes[route[1]]
    return next(iter(routes.values()))


@lru_cache(maxsize=256)
def _mechanism_rdp(event: DpEvent, q: float, orders: tuple[float, ...], route: RdpRoute) -> np.ndarray:
    fn = _route_function(type(event), route)
    out = checked_rdp_curve(orders, fn(event, q, np.asarray(orders)), f"{event} at q={q:g}")
    out.setflags(write=False)
    return out


@lru_cache(maxsize=64)
def _jointly_subsampled_rdp(event: ComposedEvent, q: float, orders: tuple[float, ...]) -> np.ndarray:
    """Every accountant's RDP of a jointly subsampled composition: its one sound route
    (:mod:`dpnoise.accounting.rdp.composed`), whatever route the accountant names for single mechanisms."""
    out = checked_rdp_curve(orders, jointly_subsampled_rdp(q, event.events, np.asarray(orders)), f"{event} at q={q:g}")
    out.setflags(write=False)
    return out


def event_rdp(event: DpEvent, orders: np.ndarray, route: RdpRoute = None) -> np.ndarray:
    """RDP curve (Renyi divergence at each order) of an arbitrary composed / subsampled event, the
    mechanism events of ``route``'s type by that route, every other one by its default route."""
    key = tuple(float(a) for a in np.asarray(orders, dtype=float))
    if isinstance(event, PoissonSampledEvent):
        if isinstance(event.event, ComposedEvent):  # one subsample, several releases (adaptive clipping's step)
            return _jointly_subsampled_rdp(event.event, event.sampling_probability, key)
        if type(event.event) not in _RDP_ROUTES:
            raise NotImplementedError(f"no RDP accountant registered for {type(event.event).__name__} (Poisson "
                                      f"sampling is accounted around a single mechanism event)")
        return _mechanism_rdp(event.event, event.sampling_probability, key, route)
    if isinstance(event, SelfComposedEvent):
        if event.count == 0:
            return np.zeros(len(key))
        return event.count * event_rdp(event.event, orders, route)
    if isinstance(event, ComposedEvent):
        return sum((event_rdp(e, orders, route) for e in event.events), np.zeros(len(key)))
    if isinstance(event, RepeatAndSelectEvent):
        return repeat_and_select_rdp(np.asarray(key), event_rdp(event.event, orders, route), event.mean, event.shape)
    return _mechanism_rdp(event, 1.0, key, route)
