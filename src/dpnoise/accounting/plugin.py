"""A mechanism as one plugin: its spec, its event type's RDP and PLD routes and its accountants,
registered together by one :func:`register_plugin` call (torch-free).

Each built-in mechanism is one module of :mod:`dpnoise.accounting.plugins` ending in that call; a
new mechanism is added the same way, and the command line, the calibrators, the audits and the
training engine read it from the registries (docs/ARCHITECTURE.md, "Adding a mechanism").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from dpnoise.accounting.events import EVENT_TYPES, register_event_type
from dpnoise.accounting.mechanisms import MECHANISMS, MechanismSpec, register_mechanism
from dpnoise.accounting.pld.distribution import PldRoute, register_pld, unregister_pld
from dpnoise.accounting.rdp.registry import RdpFunction, rdp_routes, register_rdp, unregister_rdp
from dpnoise.accounting.release_count import (
    ExactLogProfile,
    register_exact_log_profile,
    release_count_delta,
    release_count_epsilon,
    unregister_exact_log_profile,
)
from dpnoise.accounting.registry import ACCOUNTANTS, AccountantSpec, check_reported_accountants, register_accountant
from dpnoise.accounting.validation import InvalidParameterError


@dataclass(frozen=True, kw_only=True)
class MechanismPlugin:
    """Everything the accounting layer knows of one mechanism.

    ``rdp``: the RDP routes this plugin adds to its event type, by name (a new event type's first
    route is its default); ``pld``: the event type's PLD route (None: none, or one already registered
    by the plugin of another mechanism with the same event type); ``release_profile``: the exact
    privacy profile of k releases of an event of its type, for the accountants that count an
    example's releases (:mod:`~dpnoise.accounting.release_count`; None: none, or one already
    registered, as for ``pld``; without one, releases are accounted by their RDP curve);
    ``accountants``: its named accountants, the routes of a minimum before it; ``unsound_rdp``: the
    routes of ``rdp`` that are not proven bounds (a paper's formula kept for reproduction), which no
    accountant declared sound may use.
    """

    mechanism: MechanismSpec
    accountants: tuple[AccountantSpec, ...]
    rdp: Mapping[str, RdpFunction] = field(default_factory=dict)
    unsound_rdp: tuple[str, ...] = ()
    pld: Optional[PldRoute] = None
    release_profile: Optional[ExactLogProfile] = None


def _refusal(plugin: MechanismPlugin) -> Optional[str]:
    spec = plugin.mechanism
    if spec.name in MECHANISMS:
        return "is already registered"
    if any(accountant.mechanism != spec.name for accountant in plugin.accountants):
        return "has an accountant of another mechanism"
    if not plugin.rdp and not rdp_routes(spec.event_type) and plugin.pld is None:
        return f"gives {spec.event_type.__name__} neither an RDP nor a PLD route"
    unknown = [route for route in plugin.unsound_rdp if route not in plugin.rdp]
    if unknown:
        return f"declares unsound RDP routes it does not give: {', '.join(unknown)}"
    return None


def register_plugin(plugin: MechanismPlugin) -> MechanismPlugin:
    """Register ``plugin``'s event type, its RDP and PLD routes, its spec and its accountants, all or
    nothing: a refusal (:class:`InvalidParameterError` naming the mechanism) leaves every registry
    as it was."""
    spec = plugin.mechanism
    reason = _refusal(plugin)
    if reason is not None:
        raise InvalidParameterError(f"mechanism plugin {spec.name!r} {reason}")
    new_event_type = spec.event_type.__name__ not in EVENT_TYPES
    added_routes: list[str] = []
    added_pld = added_profile = False
    try:
        register_event_type(spec.event_type)
        for route, fn in plugin.rdp.items():
            register_rdp(spec.event_type, route, sound=route not in plugin.unsound_rdp)(fn)
            added_routes.append(route)
        if plugin.pld is not None:
            register_pld(spec.event_type, plugin.pld)
            added_pld = True
        if plugin.release_profile is not None:
            register_exact_log_profile(spec.event_type, plugin.release_profile)
            added_profile = True
        register_mechanism(spec)
        for accountant in plugin.accountants:
            register_accountant(accountant)
        check_reported_accountants(spec.name)
    except Exception:
        _remove(plugin, new_event_type, added_routes, added_pld, added_profile)
        raise
    return plugin


def unregister_plugin(plugin: MechanismPlugin) -> None:
    """Undo :func:`register_plugin` (a mechanism added for a test or a session)."""
    _remove(plugin, True, list(plugin.rdp), plugin.pld is not None, plugin.release_profile is not None)


def _remove(plugin: MechanismPlugin, event_type: bool, routes: list[str], pld: bool, profile: bool) -> None:
    spec = plugin.mechanism
    for cached in (release_count_epsilon, release_count_delta):  # they may hold the plugin's numbers
        cached.cache_clear()
    for accountant in plugin.accountants:
        if ACCOUNTANTS.get(accountant.name) is accountant:
            del ACCOUNTANTS[accountant.name]
    if MECHANISMS.get(spec.name) is spec:
        del MECHANISMS[spec.name]
    for route in routes:
        unregister_rdp(spec.event_type, route)
    if pld:
        unregister_pld(spec.event_type)
    if profile:
        unregister_exact_log_profile(spec.event_type)
    if event_type and not rdp_routes(spec.event_type) and EVENT_TYPES.get(spec.event_type.__name__) is spec.event_type:
        del EVENT_TYPES[spec.event_type.__name__]


__all__ = ["MechanismPlugin", "register_plugin", "unregister_plugin"]
