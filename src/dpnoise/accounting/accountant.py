"""The accountant object, in the ecosystem's idiom (Opacus ``step``/``get_epsilon``; dp_accounting
``compose``/``get_epsilon``; ``state_dict``/``load_state_dict`` for checkpoints)."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np

from dpnoise.accounting.events import (
    DpEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
)
from dpnoise.accounting.rdp.conversion import delta_from_rdp, epsilon_from_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.accounting.rdp.registry import event_rdp
from dpnoise.accounting.registry import MECHANISMS, AccountantSpec, get_spec
from dpnoise.accounting.validation import (
    check_count,
    check_delta,
    check_positive,
    check_sample_rate,
)


class UnsoundAccountantWarning(UserWarning):
    """The epsilon comes from an accountant that is not a proven upper bound."""


class RdpAccountant:
    """Renyi-DP accountant for a named accounting method (see ``dpnoise.accounting.ACCOUNTANTS``).

    >>> acc = RdpAccountant("lap2")
    >>> acc.step(noise=0.8, sample_rate=0.0043, clip=1.0, params=26010, steps=5860)
    >>> round(acc.get_epsilon(1e-5), 2)
    3.41
    """

    def __init__(self, name: str = "gaussian", orders: Optional[np.ndarray] = None) -> None:
        self.spec: AccountantSpec = get_spec(name)
        self.orders = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
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
        """Number of composed events (training steps)."""
        return sum(count for _, count in self._history)

    @property
    def history(self) -> list[tuple[DpEvent, int]]:
        return list(self._history)

    def compose(self, event: DpEvent, count: int = 1) -> "RdpAccountant":
        """Record ``count`` repetitions of ``event``; consecutive equal events are merged."""
        count = check_count("count", count, 0)
        event_rdp(event, self.orders[:1], self.spec.methods)  # fail now on unsupported events
        if self._history and self._history[-1][0] == event:
            self._history[-1] = (event, self._history[-1][1] + count)
        elif count:
            self._history.append((event, count))
        return self

    def step(
        self,
        noise: float,
        sample_rate: float,
        *,
        clip: float = 1.0,
        params: Optional[int] = None,
        alpha: Optional[float] = None,
        mechanism: Optional[str] = None,
        steps: int = 1,
    ) -> "RdpAccountant":
        """Account ``steps`` Poisson-sampled steps of ``mechanism`` (default: this accountant's).

        ``noise`` is sigma for Gaussian mechanisms, the absolute Laplace scale b for laplace-l1
        and lap2 (the accountants use b / clip), and r for dirichlet.
        """
        mechanism = mechanism or self.spec.mechanism
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {mechanism!r}; choose from {sorted(MECHANISMS)}")
        event = MECHANISMS[mechanism](noise, clip, params, alpha)
        q = check_sample_rate("sample_rate", sample_rate)
        return self.compose(PoissonSampledEvent(q, event), steps)

    # -- how it is accounted ---------------------------------------------------------------
    def get_rdp(self) -> np.ndarray:
        """Total RDP curve over ``self.orders``."""
        total = np.zeros_like(self.orders)
        for event, count in self._history:
            total = total + event_rdp(SelfComposedEvent(event, count), self.orders, self.spec.methods)
        return total

    def _warn(self) -> None:
        if not self.sound:
            warnings.warn(self.spec.warning or f"{self.name} is not sound", UnsoundAccountantWarning, stacklevel=3)

    def get_epsilon_and_order(self, delta: float) -> tuple[float, float]:
        """(epsilon, optimal Renyi order) at ``delta`` (Balle et al. 2020 conversion)."""
        delta = check_delta("delta", delta)
        self._warn()
        if not self._history:
            return 0.0, float("nan")
        return epsilon_from_rdp(self.orders, self.get_rdp(), delta)

    def get_epsilon(self, delta: float) -> float:
        """Epsilon at ``delta``: a proven upper bound iff ``self.sound``."""
        return self.get_epsilon_and_order(delta)[0]

    def get_delta(self, epsilon: float) -> float:
        """delta(epsilon) (same conversion, inverted)."""
        epsilon = check_positive("epsilon", epsilon)
        self._warn()
        if not self._history:
            return 0.0
        return delta_from_rdp(self.orders, self.get_rdp(), epsilon)[0]

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.name,
            "orders": self.orders.tolist(),
            "history": [{"event": event_to_dict(e), "count": c} for e, c in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("accountant") != self.name:
            raise ValueError(f"state is for accountant {state.get('accountant')!r}, not {self.name!r}")
        self.orders = np.asarray(state["orders"], dtype=float)
        self._history = [(event_from_dict(h["event"]), int(h["count"])) for h in state["history"]]

    def __repr__(self) -> str:
        return f"RdpAccountant({self.name!r}, steps={self.steps})"


def get_accountant(name: str, orders: Optional[np.ndarray] = None) -> RdpAccountant:
    """A fresh accountant by name ("gaussian", "laplace-l1", "lap2", "lap2-paper", "dirichlet", ...)."""
    return RdpAccountant(name, orders)
