"""Kinds of accountant: how an :class:`~dpnoise.accounting.registry.AccountantSpec` is accounted.

An :class:`AccountantKind` says, once, everything the library asks of a kind: the accountant class
that accounts it, whether it takes an RDP route, Renyi orders or routes of its own (a minimum), whether
its epsilon is cheap enough to recompute at every training step, and how a calibration solves for the
noise under it.  Each kind is registered by the module that defines its accountant class
(:mod:`~dpnoise.accounting.accountant`: "rdp", "pld", "minimum";
:mod:`~dpnoise.accounting.release_count`: "release-count"); an accountant spec names its kind by
:attr:`AccountantKind.name`.  This module imports no accountant, so that every accountant module can
register its kind here without importing another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from dpnoise.accounting.events import DpEvent
from dpnoise.accounting.validation import InvalidParameterError


class NoiseRatioSearch(Protocol):
    """One calibration, as a solve strategy sees it: find the smallest noise ratio (noise / the
    mechanism's scale) whose epsilon at :attr:`delta` under an accountant is at most :attr:`target`
    (built by :mod:`~dpnoise.accounting.calibration`)."""

    target: float
    delta: float

    def epsilon(self, accountant: str, ratio: float) -> float:
        """Epsilon at :attr:`delta` of the named accountant's ledger at ``ratio`` (no unsoundness warning)."""

    def ledger(self, accountant: str, ratio: float) -> Sequence[tuple[DpEvent, int]]:
        """The named accountant's ledger at ``ratio``, composition unrolled
        (:func:`~dpnoise.accounting.accountant.flat_ledger`)."""


#: (search, accountant name, initial ratio, a guess of d log epsilon / d log ratio there) -> the smallest
#: ratio reaching the search's target under that accountant (UnreachableTargetError where none does)
SolveStrategy = Callable[[NoiseRatioSearch, str, float, float], float]
#: (search, accountant name, ratio) -> an epsilon never below the accountant's own at that ratio, cheaper to compute
UpperBound = Callable[[NoiseRatioSearch, str, float], float]


@dataclass(frozen=True)
class AccountantKind:
    """A kind of accountant, as registered by :func:`register_accountant_kind`.

    ``accountant``: the :class:`~dpnoise.accounting.accountant.PrivacyAccountant` subclass that accounts
    the kind, called with an accountant's name (and ``orders`` where ``takes_orders``).
    ``solve``: how a calibration finds the smallest noise under an accountant of this kind.
    ``cheap_epsilon``: its epsilon is cheap enough to recompute after every training step (a minimum's
    quick epsilon takes these routes only) and to be searched first in a calibration.
    ``takes_rdp_route``: its accountants account through an RDP route of their mechanism's event, which
    they may name (a sound accountant over a sound route only).  ``takes_orders``: ``get_accountant``
    accepts a grid of Renyi orders for it.  ``minimum_of_routes``: its accountants report the smallest
    epsilon of their sound ``routes``.  ``upper_bound``: a cheaper epsilon never below the accountant's own
    (a PLD on its coarse grid alone), with which a minimum's calibration decides cheaply that a route is
    not to be skipped.
    """

    name: str
    accountant: type  # a PrivacyAccountant subclass: this module imports no accountant, which import it
    solve: SolveStrategy
    cheap_epsilon: bool = False
    takes_rdp_route: bool = False
    takes_orders: bool = False
    minimum_of_routes: bool = False
    upper_bound: Optional[UpperBound] = None


ACCOUNTANT_KINDS: dict[str, AccountantKind] = {}


def _kind_refusal(kind: AccountantKind) -> str | None:
    """Why ``kind`` cannot be registered now (None if it can)."""
    if not isinstance(kind.name, str) or not kind.name or kind.name != kind.name.strip() or " " in kind.name:
        return "needs a name: a non-empty string without spaces"
    if kind.name in ACCOUNTANT_KINDS:
        return "is already registered"
    if not isinstance(kind.accountant, type):
        return f"needs an accountant class, got {type(kind.accountant).__name__}"
    if not callable(kind.solve):
        return "needs a callable solve strategy"
    return None


def register_accountant_kind(kind: AccountantKind) -> AccountantKind:
    """Add ``kind`` to :data:`ACCOUNTANT_KINDS` (refused, :class:`InvalidParameterError` naming it: not an
    :class:`AccountantKind`, a name taken or not a string without spaces, no accountant class or solve
    strategy)."""
    if not isinstance(kind, AccountantKind):
        raise InvalidParameterError(f"register_accountant_kind takes an AccountantKind, got a {type(kind).__name__}")
    reason = _kind_refusal(kind)
    if reason is not None:
        raise InvalidParameterError(f"accountant kind {kind.name!r} {reason}")
    ACCOUNTANT_KINDS[kind.name] = kind
    return kind


def get_accountant_kind(name: str) -> AccountantKind:
    """The registered kind ``name`` (:class:`InvalidParameterError` naming the choices if unknown)."""
    if name not in ACCOUNTANT_KINDS:
        raise InvalidParameterError(f"unknown accountant kind {name!r}; choose from {', '.join(ACCOUNTANT_KINDS)}")
    return ACCOUNTANT_KINDS[name]


__all__ = [
    "ACCOUNTANT_KINDS",
    "AccountantKind",
    "NoiseRatioSearch",
    "SolveStrategy",
    "UpperBound",
    "get_accountant_kind",
    "register_accountant_kind",
]
