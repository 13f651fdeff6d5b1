"""Check an accountant's claim against the exact PLD lower bound of a feasible worst-case pair."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dpnoise.accounting import ACCOUNTANTS, MechanismOptions, epsilon_after, get_mechanism_spec
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.audit import pld

__all__ = ["audit_bound"]


def audit_bound(
    accountant: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: Optional[int] = None, ks: Optional[Sequence[int]] = None, grid: int = 1 << 21,
    loss_step: Optional[float] = None, options: Optional[MechanismOptions] = None, **option_fields: Any,
) -> dict:
    """claimed_epsilon of ``accountant`` vs the exact lower bound; consistent iff lower <= claimed.

    ``noise`` is in the unit of the accountant's mechanism, with its options (``options`` or their fields
    as keywords, e.g. ``alpha=``); the pair is the mechanism's
    :attr:`~dpnoise.accounting.mechanisms.MechanismSpec.audit_pair`."""
    spec = ACCOUNTANTS[accountant] if accountant in ACCOUNTANTS else None
    if spec is None:
        raise InvalidParameterError(f"unknown accountant {accountant!r}; choose from {sorted(ACCOUNTANTS)}")
    options = get_mechanism_spec(spec.mechanism).make_options(options, **option_fields)
    claimed = float(epsilon_after(accountant, steps=steps, delta=delta, sample_rate=sample_rate, clip=clip,
                                  params=params, options=options, noise=noise))
    result = pld.lower_bound(spec.mechanism, noise, sample_rate, steps, delta, clip=clip, params=params, ks=ks,
                             grid=grid, loss_step=loss_step, options=options)
    return {
        "audit": "bound",
        "accountant": accountant,
        "mechanism": spec.mechanism,
        "sound": spec.sound,
        "noise": noise,
        "clip": clip,
        "sample_rate": sample_rate,
        "steps": steps,
        "params": params,
        **options.to_dict(),
        "delta": delta,
        "claimed_epsilon": claimed,
        "lower_bound_epsilon": result.epsilon,
        "consistent": bool(result.epsilon <= claimed),
        "worst_pair": {"k": result.k, "direction": result.direction},
        "scan": result.scan,
        "warning": spec.warning,
    }
