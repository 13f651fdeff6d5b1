"""Named accountants: how each mechanism of :data:`~dpnoise.accounting.mechanisms.MECHANISMS` is accounted,
each added by :func:`register_accountant` (the built-in ones by their mechanism's plugin,
:mod:`dpnoise.accounting.plugins`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dpnoise.accounting.kinds import ACCOUNTANT_KINDS, AccountantKind, get_accountant_kind
from dpnoise.accounting.mechanisms import MECHANISMS, get_mechanism_spec
from dpnoise.accounting.rdp.registry import RdpRoute, rdp_route_is_sound, rdp_routes
from dpnoise.accounting.validation import InvalidParameterError


@dataclass(frozen=True)
class AccountantSpec:
    """A named accountant: the mechanism it accounts for and how.

    ``kind``: the name of a registered :class:`~dpnoise.accounting.kinds.AccountantKind`
    (:data:`~dpnoise.accounting.kinds.ACCOUNTANT_KINDS`): rdp (Renyi DP), pld (privacy loss
    distributions, :mod:`dpnoise.accounting.pld`), minimum (per delta, the smallest epsilon of the sound
    ``routes``) or
    release-count (an output mechanism's profile as the Bin(T, q) mixture over the changed example's
    number of releases from its RDP, :mod:`dpnoise.accounting.release_count`).  ``rdp_route``: which
    RDP route of the mechanism's event type a kind that takes one uses (None: its default, the first
    its plugin registered; :func:`dpnoise.accounting.rdp.registry.rdp_routes`).
    """

    name: str
    mechanism: str
    sound: bool
    description: str
    warning: Optional[str] = None
    kind: str = "rdp"
    routes: tuple[str, ...] = ()
    rdp_route: Optional[str] = None

    @property
    def accountant_kind(self) -> AccountantKind:
        """The registered kind :attr:`kind` names: how this accountant is accounted and calibrated."""
        return get_accountant_kind(self.kind)

    @property
    def rdp_route_key(self) -> RdpRoute:
        """The route as :func:`~dpnoise.accounting.rdp.registry.event_rdp` takes it: (the mechanism's
        event type, ``rdp_route``), or None for the defaults."""
        return None if self.rdp_route is None else (get_mechanism_spec(self.mechanism).event_type, self.rdp_route)

    @property
    def scope(self) -> Optional[str]:
        """What the epsilon covers when it is not the trained model (the mechanism's scope)."""
        return get_mechanism_spec(self.mechanism).scope


ACCOUNTANTS: dict[str, AccountantSpec] = {}


def _field_problem(spec: AccountantSpec) -> Optional[str]:
    """Why a field of ``spec`` has the wrong type or form (None: none has)."""
    if not isinstance(spec.name, str) or not spec.name or spec.name != spec.name.strip() or " " in spec.name:
        return "needs a name: a non-empty string without spaces"
    for name, value in (("mechanism", spec.mechanism), ("description", spec.description), ("kind", spec.kind)):
        if not isinstance(value, str):
            return f"needs a string {name}, got {type(value).__name__}"
    if type(spec.sound) is not bool:
        return f"needs sound=True or False, got {spec.sound!r}"
    if spec.warning is not None and not isinstance(spec.warning, str):
        return f"needs a string warning (or None), got {type(spec.warning).__name__}"
    if spec.rdp_route is not None and not isinstance(spec.rdp_route, str):
        return f"needs a string rdp_route (or None), got {type(spec.rdp_route).__name__}"
    if not isinstance(spec.routes, tuple) or not all(isinstance(route, str) for route in spec.routes):
        return "needs routes as a tuple of accountant names"
    return None


def _refusal(spec: AccountantSpec) -> Optional[str]:
    """Why ``spec`` cannot be registered now (None if it can)."""
    problem = _field_problem(spec)
    if problem is not None:
        return problem
    if spec.name in ACCOUNTANTS:
        return "is already registered"
    if spec.mechanism not in MECHANISMS:
        return f"accounts for mechanism {spec.mechanism!r}, which is not registered (register_mechanism first)"
    if spec.kind not in ACCOUNTANT_KINDS:
        return f"has kind {spec.kind!r}; choose from {', '.join(ACCOUNTANT_KINDS)}"
    kind, event_type = ACCOUNTANT_KINDS[spec.kind], MECHANISMS[spec.mechanism].event_type
    if spec.rdp_route is not None:
        if not kind.takes_rdp_route:
            return f"is of kind {spec.kind!r}, which takes no RDP route"
        if spec.rdp_route not in rdp_routes(event_type):
            return (f"names RDP route {spec.rdp_route!r}, which {event_type.__name__} does not have (it has "
                    f"{', '.join(rdp_routes(event_type)) or 'none'})")
    if spec.sound and kind.takes_rdp_route and not rdp_route_is_sound(event_type, spec.rdp_route):
        return (f"is declared sound over RDP route {spec.rdp_route!r}, which its mechanism's plugin declares not "
                f"sound (a formula kept for reproduction, not a proven bound)")
    if spec.sound and spec.warning is not None:
        return "is sound and takes no warning"
    if not spec.sound and spec.warning is None:
        return "is not sound and needs a warning (printed with its epsilons)"
    if not kind.minimum_of_routes:
        return f"is of kind {spec.kind!r}, which takes no routes (a minimum does)" if spec.routes else None
    if not spec.routes:
        return "is a minimum of routes and needs at least one"
    if not spec.sound:
        return "is a minimum of sound routes and must be declared sound"
    for route in spec.routes:
        if route not in ACCOUNTANTS:
            return f"has route {route!r}, which is not registered (register the routes before their minimum)"
        if ACCOUNTANTS[route].mechanism != spec.mechanism:
            return f"has route {route!r} of mechanism {ACCOUNTANTS[route].mechanism!r}, not {spec.mechanism!r}"
        if not ACCOUNTANTS[route].sound:
            return f"has route {route!r}, which is not sound (a minimum is a proven bound over sound routes only)"
    return None


def register_accountant(spec: AccountantSpec) -> AccountantSpec:
    """Add ``spec`` to :data:`ACCOUNTANTS`, after checking it.

    Refused (:class:`InvalidParameterError` naming the accountant): a ``spec`` that is not an
    :class:`AccountantSpec`, or a field of the wrong type (a name that is not a non-empty string
    without spaces, ``sound`` not a bool); a sound accountant over an RDP route its plugin declares
    unsound; a name already registered; a mechanism not in :data:`MECHANISMS`; an unknown kind; an
    unsound accountant without a warning or
    a sound one with a warning; routes on an accountant that is not a minimum; a minimum without
    routes, not declared sound, or with a route that is not registered yet, of another mechanism or
    not sound.  A minimum is listed just before the first of its routes (the command line lists a
    mechanism's default accountant first): register the routes, then their minimum.
    """
    if not isinstance(spec, AccountantSpec):
        raise InvalidParameterError(f"register_accountant takes an AccountantSpec, got a {type(spec).__name__}")
    reason = _refusal(spec)
    if reason is not None:
        raise InvalidParameterError(f"accountant {spec.name!r} {reason}")
    if not spec.accountant_kind.minimum_of_routes:
        ACCOUNTANTS[spec.name] = spec
        return spec
    entries = list(ACCOUNTANTS.items())
    entries.insert(min(list(ACCOUNTANTS).index(route) for route in spec.routes), (spec.name, spec))
    ACCOUNTANTS.clear()  # in place: modules hold a reference to the one dictionary
    ACCOUNTANTS.update(entries)
    return spec


def accountants_for_mechanism(mechanism: str, include_options: bool = False) -> list[str]:
    """Names of the accountants that apply to ``mechanism``, the default (sound) one first."""
    reported = list(get_mechanism_spec(mechanism).accountants)
    if include_options:
        return reported + [n for n, s in ACCOUNTANTS.items() if s.mechanism == mechanism and n not in reported]
    return reported


def get_spec(name: str) -> AccountantSpec:
    """The named accountant's spec (``ValueError`` naming the choices if unknown)."""
    if name not in ACCOUNTANTS:
        raise InvalidParameterError(f"unknown accountant {name!r}; choose from {sorted(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]


def check_reported_accountants(mechanism: str) -> None:
    """``mechanism``'s reported accountants are registered and account for it, its default one sound
    (what :func:`register_accountant` cannot check alone, once the mechanism has its accountants)."""
    spec = get_mechanism_spec(mechanism)
    for name in spec.accountants:
        if name not in ACCOUNTANTS:
            raise InvalidParameterError(f"mechanism {mechanism!r} lists accountant {name!r}, which is not registered")
        if ACCOUNTANTS[name].mechanism != mechanism:
            raise InvalidParameterError(f"mechanism {mechanism!r} lists accountant {name!r} of another mechanism")
    if not ACCOUNTANTS[spec.default_accountant].sound:
        raise InvalidParameterError(f"mechanism {mechanism!r}: its default accountant must be sound")
