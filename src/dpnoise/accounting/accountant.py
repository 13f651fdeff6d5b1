"""Accountant objects, in the ecosystem's idiom (Opacus ``step``/``get_epsilon``; dp_accounting
``compose``/``get_epsilon``; ``state_dict``/``load_state_dict`` for checkpoints).

What happened is a ledger of DP events (:mod:`dpnoise.accounting.events`); how it is accounted
depends on the accountant's kind (:mod:`dpnoise.accounting.kinds`; the kinds below are registered here,
the release-count kind by :mod:`dpnoise.accounting.release_count`):

* :class:`RdpAccountant` -- Renyi DP over a grid of orders, converted to (epsilon, delta);
* :class:`PldAccountant` -- privacy loss distributions, pessimistic rounding, round-off bounded;
* :class:`MinimumAccountant` -- several sound routes for the same ledger; reports, for each delta,
  the smallest of their epsilons and names the route that gave it (a minimum of proven upper
  bounds is a proven upper bound).

Every kind accounts the ledger's continuous events: a secure-mode step
(:class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent`) as the continuous step it approximates;
the public queries then correct the whole ledger's answer once
(:func:`~dpnoise.accounting.secure_noise.released_epsilon`), so that whoever reads any accountant of a
secure run gets that run's epsilon.
"""

from __future__ import annotations

import warnings
from numbers import Integral
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from dpnoise.accounting.events import (
    ComposedEvent,
    DpEvent,
    PoissonSampledEvent,
    RepeatAndSelectEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
)
from dpnoise.accounting.pld.distribution import pld_delta, pld_epsilon, pld_unavailable
from dpnoise.accounting.rdp.conversion import delta_from_rdp, epsilon_from_rdp
from dpnoise.accounting.rdp.curve import checked_rdp_curve
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.accounting.rdp.registry import event_rdp
from dpnoise.accounting.kinds import AccountantKind, register_accountant_kind
from dpnoise.accounting.mechanisms import (
    MechanismOptions,
    RunFacts,
    get_mechanism_spec,
    noise_from_keywords,
    noise_parameters,
)
from dpnoise.accounting.registry import AccountantSpec, get_spec
from dpnoise.accounting.secure_noise import continuous_event, discrete_log_ratio, released_delta, released_epsilon
from dpnoise.accounting.solvers import coarse_pld_epsilon, solve_by_pld_passes, solve_directly, solve_over_routes
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_count,
    check_delta,
    check_orders,
    check_positive,
    check_sample_rate,
)

Ledger = tuple[tuple[DpEvent, int], ...]


class UnsoundAccountantWarning(UserWarning):
    """The epsilon comes from an accountant that is not a proven upper bound."""


class PrivacyAccountant:
    """The ledger and the API shared by every accountant; subclasses say how it is accounted."""

    def __init__(self, name: str) -> None:
        self.spec: AccountantSpec = get_spec(name)
        kind = self.spec.accountant_kind
        if not isinstance(self, kind.accountant):
            raise InvalidParameterError(f"accountant {name!r} is of kind {kind.name!r}, accounted by "
                                        f"{kind.accountant.__name__}, not {type(self).__name__}")
        self._history: list[tuple[DpEvent, int]] = []

    # -- what happened -------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def sound(self) -> bool:
        """Whether every epsilon of this accountant is a proven upper bound."""
        return self.spec.sound

    @property
    def steps(self) -> int:
        """Number of Poisson-sampled events in the ledger (training steps, as :meth:`step` records them;
        q = 1 is a full-batch step).  Releases of the whole data set (e.g. noisy feature statistics
        composed before training) are in the ledger as their mechanism events, not steps: which is
        why ``make_private(data_releases=...)`` refuses a ``PoissonSampledEvent`` among them."""
        return sum(count for event, count in self._accounted() if isinstance(event, PoissonSampledEvent))

    @property
    def history(self) -> list[tuple[DpEvent, int]]:
        return list(self._history)

    def _accounted(self) -> list[tuple[DpEvent, int]]:
        """The ledger as the routes account it: each discrete step as its continuous step."""
        return [(continuous_event(event), count) for event, count in self._history]

    def _check_supported(self, event: DpEvent) -> None:
        """Raise now (not at the first query) if this accountant cannot account ``event``."""

    def compose(self, event: DpEvent, count: int = 1) -> "PrivacyAccountant":
        """Record ``count`` repetitions of ``event``; consecutive equal events are merged."""
        count = check_count("count", count, 0)
        try:
            self._check_supported(continuous_event(event))
        except NotImplementedError as err:
            raise InvalidParameterError(f"accountant {self.name!r} cannot account {event!r}: {err}") from None
        if self._history and self._history[-1][0] == event:
            self._history[-1] = (event, self._history[-1][1] + count)
        elif count:
            self._history.append((event, count))
        return self

    def step(
        self,
        *,
        sample_rate: float,
        noise: Optional[float] = None,
        noise_multiplier: Optional[float] = None,
        laplace_scale: Optional[float] = None,
        concentration: Optional[float] = None,
        clip: float = 1.0,
        params: Optional[int] = None,
        options: Optional[MechanismOptions] = None,
        alpha: Optional[float] = None,
        num_classes: Optional[int] = None,
        mechanism: Optional[str] = None,
        steps: int = 1,
        **keywords: Any,
    ) -> "PrivacyAccountant":
        """Account ``steps`` Poisson-sampled steps of ``mechanism`` (default: this accountant's).

        The noise is given as ``noise`` or under the keyword of the mechanism's unit
        (:data:`dpnoise.accounting.mechanisms.MECHANISMS`), and only that one:
        ``noise_multiplier`` sigma (noise std sigma * C) for ``gaussian`` and
        ``penultimate-gaussian``, ``laplace_scale`` b (absolute; accounted through b / ``clip``)
        for ``laplace-l1`` and ``lap2``, ``concentration`` r for ``dirichlet``.
        ``options``: the mechanism's side parameters (:attr:`MechanismSpec.options`), or their fields as
        keywords: ``alpha`` and ``num_classes`` for ``dirichlet`` (the number of classes of the perturbed
        softmax output, where known; with 2 the default ``dirichlet`` accountant also has its exact two-class
        PLD route, docs/theory/dirichlet.md Sec. 1.3. Give it only if every release has that many classes).
        ``keywords``: a registered mechanism's own noise keyword or option fields.
        """
        own, given = self.spec.mechanism, mechanism or self.spec.mechanism
        if given != own and "outputs" in (get_mechanism_spec(given).perturbs, get_mechanism_spec(own).perturbs):
            # an output mechanism's release is accounted under replace-one adjacency, a noisy gradient sum under
            # add/remove: their events (both Gaussian for penultimate-gaussian) cannot share one ledger
            raise InvalidParameterError(f"accountant {self.name!r} accounts the {own} mechanism, not {given}: an "
                                        f"output mechanism's steps are accounted by its own accountants only")
        event = step_event_from_keywords(
            given, sample_rate=sample_rate, noise=noise, noise_multiplier=noise_multiplier, laplace_scale=laplace_scale,
            concentration=concentration, clip=clip, params=params, options=options, alpha=alpha, num_classes=num_classes,
            **keywords)
        return self.compose(event, steps)

    # -- how it is accounted ---------------------------------------------------------------
    def _warn(self) -> None:
        if not self.sound:
            warnings.warn(self.spec.warning or f"{self.name} is not sound", UnsoundAccountantWarning, stacklevel=3)

    def _epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        raise NotImplementedError

    def _delta(self, epsilon: float) -> float:
        raise NotImplementedError

    def get_epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        """(epsilon at ``delta``, which bound gave it: e.g. "Renyi order 12", "PLD")."""
        delta = check_delta("delta", delta)
        self._warn()
        if not self._history:
            return 0.0, "no steps"
        epsilon, bound = self._released(self._epsilon_and_bound, delta)
        log_ratio = discrete_log_ratio(self._history)
        return epsilon, bound + (f", plus the discrete Gaussian's correction {2 * log_ratio:.3g}" if log_ratio else "")

    def _released(self, answer_at: Callable[[float], tuple[float, Any]], delta: float) -> tuple[float, Any]:
        """(epsilon at ``delta`` of the ledger as released, the detail ``answer_at`` gave with it), from
        ``answer_at(delta') = (epsilon, detail)`` of the continuous ledger: the discrete steps' correction
        applied once (:func:`~dpnoise.accounting.secure_noise.released_epsilon`)."""
        details: list[Any] = []

        def epsilon_at(at_delta: float) -> float:
            epsilon, detail = answer_at(at_delta)
            details.append(detail)
            return epsilon

        return released_epsilon(epsilon_at, delta, discrete_log_ratio(self._history)), details[0]

    def get_epsilon(self, delta: float) -> float:
        """Epsilon at ``delta``: a proven upper bound iff ``self.sound``."""
        return self.get_epsilon_and_bound(delta)[0]

    def get_quick_epsilon(self, delta: float) -> float:
        """A proven upper bound on :meth:`get_epsilon` that is cheap to recompute at every step.

        The same value for a single route; a :class:`MinimumAccountant` takes the minimum over its
        routes whose kind has a cheap epsilon (:attr:`~dpnoise.accounting.kinds.AccountantKind.cheap_epsilon`,
        the RDP routes: a PLD recomputed after every step would cost more than the step itself).
        """
        delta = check_delta("delta", delta)
        if not self._history:
            return self.get_epsilon(delta)
        self._warn()
        return released_epsilon(self._quick_epsilon, delta, discrete_log_ratio(self._history))

    def _quick_epsilon(self, delta: float) -> float:
        return self._epsilon_and_bound(delta)[0]

    def get_delta(self, epsilon: float) -> float:
        """delta(epsilon), capped at 1."""
        epsilon = check_positive("epsilon", epsilon)
        self._warn()
        if not self._history:
            return 0.0
        return released_delta(self._delta, epsilon, discrete_log_ratio(self._history))

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.name,
            "history": [{"event": event_to_dict(e), "count": c} for e, c in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of this accountant, after checking it (nothing changes if refused).

        Refused (:class:`InvalidParameterError` naming the entry): another accountant's state,
        missing or unknown keys, a ledger entry that is not ``{"event": ..., "count": n}`` with n an
        int >= 0 (no float, string or bool), an event that is malformed or that this accountant
        cannot account.
        """
        self._history = self._checked_state(state)

    def _checked_state(self, state: Any) -> list[tuple[DpEvent, int]]:
        """The ledger of ``state`` after checking its keys and entries (see :meth:`load_state_dict`)."""
        if not isinstance(state, dict):
            raise InvalidParameterError(f"state must be a dictionary (from state_dict()), got {type(state).__name__}")
        if state.get("accountant") != self.name:
            raise InvalidParameterError(f"state is for accountant {state.get('accountant')!r}, not {self.name!r}")
        expected = set(self.state_dict())
        missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected, key=repr)
        if missing or unknown:
            problem = f"no {', '.join(map(repr, missing))}" if missing else f"unknown key {unknown[0]!r}"
            raise InvalidParameterError(f"state of accountant {self.name!r} has {problem}")
        history = state["history"]
        if not isinstance(history, (list, tuple)):
            raise InvalidParameterError(f"state history must be a list of ledger entries, got {type(history).__name__}")
        ledger = []
        for i, entry in enumerate(history):
            if not isinstance(entry, dict) or set(entry) != {"event", "count"}:
                raise InvalidParameterError(f"state history[{i}] must be {{'event': ..., 'count': ...}}, got {entry!r}")
            count = entry["count"]
            if isinstance(count, bool) or not isinstance(count, Integral) or count < 0:
                raise InvalidParameterError(f"state history[{i}] count must be an integer >= 0, got {count!r}")
            try:
                event = event_from_dict(entry["event"])
                self._check_supported(continuous_event(event))
            except (InvalidParameterError, NotImplementedError) as err:
                raise InvalidParameterError(f"state history[{i}] event: {err}") from None
            ledger.append((event, int(count)))
        return ledger

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, steps={self.steps})"


class RdpAccountant(PrivacyAccountant):
    """Renyi-DP accountant for a named accounting method (see ``dpnoise.accounting.ACCOUNTANTS``).

    >>> acc = RdpAccountant("lap2-rdp")
    >>> acc.step(laplace_scale=0.8, sample_rate=0.0043, clip=1.0, params=26010, steps=5860)
    RdpAccountant('lap2-rdp', steps=5860)
    >>> round(acc.get_epsilon(1e-5), 2)
    3.41
    """

    def __init__(self, name: str = "gaussian-rdp", orders: Optional[np.ndarray] = None) -> None:
        super().__init__(name)
        self.orders = DEFAULT_ORDERS.copy() if orders is None else check_orders("orders", orders)

    def _check_supported(self, event: DpEvent) -> None:
        event_rdp(event, self.orders[:1], self.spec.rdp_route_key)

    def get_rdp(self) -> np.ndarray:
        """Total RDP curve over ``self.orders`` (checked: no NaN, >= 0, non-decreasing)."""
        total = np.zeros_like(self.orders)
        for event, count in self._accounted():
            total = total + event_rdp(SelfComposedEvent(event, count), self.orders, self.spec.rdp_route_key)
        return checked_rdp_curve(self.orders, total, f"accountant {self.name}")

    def get_epsilon_and_order(self, delta: float) -> tuple[float, float]:
        """(epsilon, optimal Renyi order) at ``delta`` (Balle et al. 2020 conversion; a secure run's
        correction included, as in :meth:`get_epsilon`)."""
        delta = check_delta("delta", delta)
        self._warn()
        if not self._history:
            return 0.0, float("nan")
        return self._released(lambda at_delta: epsilon_from_rdp(self.orders, self.get_rdp(), at_delta), delta)

    def _epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        epsilon, order = epsilon_from_rdp(self.orders, self.get_rdp(), delta)
        return epsilon, f"Renyi order {order:g}"

    def _delta(self, epsilon: float) -> float:
        return delta_from_rdp(self.orders, self.get_rdp(), epsilon)[0]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "orders": self.orders.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ledger = self._checked_state(state)
        self.orders, self._history = check_orders("state orders", state["orders"]), ledger


def flat_ledger(history: list[tuple[DpEvent, int]]) -> Ledger:
    """The ledger as (Poisson-sampled mechanism event, count) pairs (composition unrolled)."""

    def unroll(event: DpEvent, count: int) -> Iterator[tuple[DpEvent, int]]:
        if isinstance(event, SelfComposedEvent):
            yield from unroll(event.event, count * event.count)
        elif isinstance(event, ComposedEvent):
            for inner in event.events:
                yield from unroll(inner, count)
        elif isinstance(event, PoissonSampledEvent):
            yield event, count
        else:
            yield PoissonSampledEvent(1.0, event), count

    return tuple(pair for event, count in history for pair in unroll(event, count) if pair[1])


class PldAccountant(PrivacyAccountant):
    """Privacy-loss-distribution accountant (pessimistic connect-the-dots PLDs, round-off bounded;
    :mod:`dpnoise.accounting.pld`).

    Covers Poisson-sampled Gaussian, Laplace (L1) and, through Gaussian-DP domination, Lap2 steps,
    and two-class Dirichlet steps (replace-one adjacency, inclusion visible).
    Where the PLD grid would be too large (e.g. sigma below ~0.02, or more than 1e6 steps) it
    reports epsilon = +inf with the reason; the default accountants then use their RDP route.

    >>> acc = PldAccountant("gaussian-pld").step(noise_multiplier=0.7928, sample_rate=258 / 60000, steps=5860)
    >>> round(acc.get_epsilon(1e-5), 2)
    2.99
    """

    def __init__(self, name: str = "gaussian-pld") -> None:
        super().__init__(name)

    def _check_supported(self, event: DpEvent) -> None:
        """Refuse an event that has no PLD, except an event of this accountant's own mechanism: where
        its PLD exists for some parameters only (the Dirichlet mechanism's, for two classes), the
        route answers +inf with the reason for the others (so that the minimum it is a route of
        answers by its other routes); so does a tuning job's best trial of repeated ones
        (:class:`~dpnoise.accounting.events.RepeatAndSelectEvent`) whose trial it could account, and a
        jointly subsampled composition (adaptive clipping's step where it is no single mechanism,
        :mod:`dpnoise.accounting.adaptive_clipping`), which has no PLD route."""
        own_events = get_mechanism_spec(self.spec.mechanism).event_type
        for sampled, _ in flat_ledger([(event, 1)]):
            reason = pld_unavailable(sampled.event)
            if isinstance(sampled.event, RepeatAndSelectEvent):  # tuning: +inf with the reason, a minimum's RDP answers
                self._check_supported(sampled.event.event)
            elif isinstance(sampled.event, ComposedEvent):  # adaptive clipping's joint step: likewise
                continue
            elif reason is not None and not isinstance(sampled.event, own_events):
                raise InvalidParameterError(f"accountant {self.name!r}: {reason}")

    def _epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        epsilon, reason = pld_epsilon(flat_ledger(self._accounted()), delta)
        return epsilon, "PLD (pessimistic connect-the-dots, round-off bounded)" if reason is None else f"PLD not computed: {reason}"

    def _delta(self, epsilon: float) -> float:
        return pld_delta(flat_ledger(self._accounted()), epsilon)[0]


class MinimumAccountant(PrivacyAccountant):
    """The smallest epsilon of several sound accountants ("routes") of the same ledger, per delta.

    >>> acc = MinimumAccountant("gaussian").step(noise_multiplier=0.7928, sample_rate=258 / 60000, steps=5860)
    >>> eps, bound = acc.get_epsilon_and_bound(1e-5)
    >>> round(eps, 2), bound.split(":")[0]
    (2.99, 'gaussian-pld')
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        if not self.spec.routes:
            raise InvalidParameterError(f"accountant {name!r} is not a minimum of routes")
        if not all(get_spec(route).sound for route in self.spec.routes) or not self.sound:
            raise InvalidParameterError(f"accountant {name!r}: a minimum is sound only over sound routes")

    def routes(self) -> list[PrivacyAccountant]:
        """A fresh accountant per route, holding this ledger's continuous events (the minimum corrects
        for discrete steps once, over the routes' minimum)."""
        out = []
        for route in self.spec.routes:
            acc = get_accountant(route)
            acc._history = self._accounted()  # noqa: SLF001 (same ledger, other method)
            out.append(acc)
        return out

    def _check_supported(self, event: DpEvent) -> None:
        for route in self.spec.routes:
            get_accountant(route)._check_supported(event)  # noqa: SLF001

    def epsilon_by_route(self, delta: float) -> dict[str, tuple[float, str]]:
        """{route: (epsilon, bound)} at ``delta``."""
        delta = check_delta("delta", delta)
        return {acc.name: acc.get_epsilon_and_bound(delta) for acc in self.routes()}

    def _epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        by_route = self.epsilon_by_route(delta)
        route = min(by_route, key=lambda name: by_route[name][0])
        epsilon, bound = by_route[route]
        # A route listed before the one that answered but that could not answer (e.g. a PLD whose
        # round-off bound exceeds delta) is named with its reason; later ones that do not apply are not.
        earlier = self.spec.routes[:self.spec.routes.index(route)]
        skipped = [f"{name}: {by_route[name][1]}" for name in earlier if by_route[name][0] == np.inf]
        return epsilon, f"{route}: {bound}" + (f" ({'; '.join(skipped)})" if skipped else "")

    def _delta(self, epsilon: float) -> float:
        return min(acc.get_delta(epsilon) for acc in self.routes())

    def _quick_epsilon(self, delta: float) -> float:
        cheap = [acc for acc in self.routes() if acc.spec.accountant_kind.cheap_epsilon]
        return min(acc.get_epsilon(delta) for acc in cheap) if cheap else self._epsilon_and_bound(delta)[0]


def training_step_event(mechanism: str, *, sample_rate: float, noise: float, facts: RunFacts = RunFacts(),
                        options: Optional[MechanismOptions] = None) -> PoissonSampledEvent:
    """The DP event of one training step of ``mechanism``: its mechanism event at ``noise`` (in its unit),
    with its ``options`` and the run's ``facts``, on a Poisson subsample at rate ``sample_rate``.  What
    :meth:`PrivacyAccountant.step` composes, and what a training run builds once and composes at every
    step."""
    event = get_mechanism_spec(mechanism).build_event(noise, options, facts)
    return PoissonSampledEvent(check_sample_rate("sample_rate", sample_rate), event)


def step_event_from_keywords(mechanism: str, *, sample_rate: float, clip: float = 1.0, params: Optional[int] = None,
                             options: Optional[MechanismOptions] = None, **keywords: Any) -> PoissonSampledEvent:
    """:func:`training_step_event` from :meth:`PrivacyAccountant.step`'s keywords: the noise as ``noise`` or
    under its unit's keyword, the options as ``options`` or their fields (``alpha=``, ``num_classes=``)."""
    spec = get_mechanism_spec(mechanism)
    units = {"noise", *noise_parameters()}
    noise = noise_from_keywords(mechanism, **{k: v for k, v in keywords.items() if k in units})
    options = spec.make_options(options, **{k: v for k, v in keywords.items() if k not in units})
    return training_step_event(mechanism, sample_rate=sample_rate, noise=noise,
                               facts=RunFacts(clip=clip, params=params), options=options)


def epsilon_after(accountant: str, *, steps: int, delta: float, releases: Sequence[DpEvent] = (),
                  **step_arguments: Any) -> float:
    """Epsilon at ``delta`` of a fresh ``accountant`` after ``releases`` and then ``steps`` identical steps.

    ``step_arguments`` as for :meth:`PrivacyAccountant.step` (``sample_rate``, the noise keyword
    of the mechanism, ``clip``, ...); ``releases``: events composed before the steps (e.g. noisy
    statistics of the training data).  The unsound-accountant warning is not raised: this is for
    callers that report each accountant's soundness themselves (tables, audits, calibration).
    """
    mechanism = step_arguments.pop("mechanism", None) or get_spec(accountant).mechanism
    return epsilon_of_events(accountant, step_event_from_keywords(mechanism, **step_arguments), steps=steps,
                             delta=delta, releases=releases)


def epsilon_of_events(accountant: str, event: DpEvent, *, steps: int, delta: float,
                      releases: Sequence[DpEvent] = ()) -> float:
    """Epsilon at ``delta`` of a fresh ``accountant`` after ``releases`` and then ``steps`` x ``event``
    (no unsound-accountant warning, as :func:`epsilon_after`)."""
    acc = accountant_holding(accountant, releases).compose(event, steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return acc.get_epsilon(delta)


def accountant_holding(name: str, releases: Sequence[DpEvent]) -> PrivacyAccountant:
    """A fresh accountant ``name`` whose ledger holds ``releases`` (events before any training step)."""
    acc = get_accountant(name)
    for release in releases:
        acc.compose(release)
    return acc


register_accountant_kind(AccountantKind("rdp", RdpAccountant, solve_directly, cheap_epsilon=True,
                                        takes_rdp_route=True, takes_orders=True))
register_accountant_kind(AccountantKind("pld", PldAccountant, solve_by_pld_passes, upper_bound=coarse_pld_epsilon))
register_accountant_kind(AccountantKind("minimum", MinimumAccountant, solve_over_routes, minimum_of_routes=True))


def get_accountant(name: str, orders: Optional[np.ndarray] = None) -> PrivacyAccountant:
    """A fresh accountant by name (``dpnoise.accounting.ACCOUNTANTS``: "gaussian", "lap2", ...), of the class
    its kind names; ``orders``: the Renyi orders, for a kind that takes them (RDP)."""
    kind = get_spec(name).accountant_kind
    if orders is None:
        return kind.accountant(name)
    if not kind.takes_orders:
        raise InvalidParameterError(f"orders= applies to RDP accountants only, not {name!r} ({kind.name})")
    return kind.accountant(name, orders)


__all__ = [
    "MinimumAccountant",
    "PldAccountant",
    "PrivacyAccountant",
    "RdpAccountant",
    "UnsoundAccountantWarning",
    "accountant_holding",
    "epsilon_after",
    "epsilon_of_events",
    "flat_ledger",
    "get_accountant",
    "step_event_from_keywords",
    "training_step_event",
]
