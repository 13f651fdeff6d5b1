"""What the library claims: epsilon of every accountant that applies to a mechanism."""

from __future__ import annotations

import warnings
from typing import Optional

from dpnoise.accounting import (
    ACCOUNTANTS,
    UnsoundAccountantWarning,
    accountants_for_mechanism,
    get_accountant,
)

__all__ = ["claimed_epsilons", "sound_claim"]


def claimed_epsilons(
    mechanism: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: Optional[int] = None, alpha: Optional[float] = None,
) -> dict[str, float]:
    """Epsilon(delta) of every accountant registered for ``mechanism`` (options included)."""
    out = {}
    for name in accountants_for_mechanism(mechanism, include_options=True):
        acc = get_accountant(name)
        acc.step(noise, sample_rate, clip=clip, params=params, alpha=alpha, steps=steps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsoundAccountantWarning)
            out[name] = float(acc.get_epsilon(delta))
    return out


def sound_claim(claims: dict[str, float]) -> float:
    """The smallest epsilon among the SOUND accountants: the strictest claim that must hold."""
    return min(eps for name, eps in claims.items() if ACCOUNTANTS[name].sound)
