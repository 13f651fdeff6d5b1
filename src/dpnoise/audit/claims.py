"""What the library claims: epsilon of every accountant that applies to a mechanism."""

from __future__ import annotations

from typing import Any, Optional

from dpnoise.accounting import ACCOUNTANTS, MechanismOptions, accountants_for_mechanism, epsilon_after, get_mechanism_spec

__all__ = ["audit_record", "claimed_epsilons", "sound_claim"]


def claimed_epsilons(
    mechanism: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: Optional[int] = None, options: Optional[MechanismOptions] = None,
    **option_fields: Any,
) -> dict[str, float]:
    """Epsilon(delta) of every accountant registered for ``mechanism`` (the accountants flagged as options
    included).

    ``noise`` is in the mechanism's unit (:data:`dpnoise.accounting.MECHANISMS`), with the mechanism's
    ``options`` or their fields as keywords (``alpha=``)."""
    options = get_mechanism_spec(mechanism).make_options(options, **option_fields)
    return {
        name: float(epsilon_after(name, steps=steps, delta=delta, sample_rate=sample_rate, clip=clip, params=params,
                                  options=options, noise=noise))
        for name in accountants_for_mechanism(mechanism, include_options=True)
    }


def sound_claim(claims: dict[str, float]) -> float:
    """The smallest epsilon among the SOUND accountants: the strictest claim that must hold."""
    return min(eps for name, eps in claims.items() if ACCOUNTANTS[name].sound)


def audit_record(
    audit: str, mechanism: str, noise: float, sample_rate: float, steps: int, delta: float,
    claims: dict[str, float], lower_bound: float, confidence: float, **details: object,
) -> dict:
    """The result of an audit: its setting, the claimed epsilons, the empirical lower bound, and
    whether the sound claim survives (lower bound <= the smallest sound epsilon)."""
    claimed = sound_claim(claims)
    return {
        "audit": audit, "mechanism": mechanism, "noise": noise, "sample_rate": sample_rate,
        "steps": steps, "delta": delta, **details,
        "claimed_epsilon": claimed, "epsilon_by_accountant": claims, "lower_bound_epsilon": lower_bound,
        "confidence": confidence, "consistent": bool(lower_bound <= claimed),
    }

