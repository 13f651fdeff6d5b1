"""Check an accountant's claim against the exact PLD lower bound of a feasible worst-case pair."""

from __future__ import annotations

from typing import Optional, Sequence

from dpnoise.accounting import ACCOUNTANTS, epsilon_after, get_mechanism_spec, noise_keywords
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.audit import pld

__all__ = ["audit_bound"]


def audit_bound(
    accountant: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: Optional[int] = None, alpha: Optional[float] = None,
    ks: Optional[Sequence[int]] = None, grid: int = 1 << 21, loss_step: Optional[float] = None,
) -> dict:
    """claimed_epsilon of ``accountant`` vs the exact lower bound; consistent iff lower <= claimed.

    ``noise`` is in the unit of the accountant's mechanism; the pair is the mechanism's
    :attr:`~dpnoise.accounting.mechanisms.MechanismSpec.audit_pair`."""
    spec = ACCOUNTANTS[accountant] if accountant in ACCOUNTANTS else None
    if spec is None:
        raise InvalidParameterError(f"unknown accountant {accountant!r}; choose from {sorted(ACCOUNTANTS)}")
    mechanism = get_mechanism_spec(spec.mechanism)
    if mechanism.uses_alpha and alpha is None:
        alpha = 1.0
    claimed = float(epsilon_after(accountant, steps=steps, delta=delta, sample_rate=sample_rate, clip=clip,
                                  params=params, alpha=alpha, **noise_keywords(spec.mechanism, noise)))
    result = pld.lower_bound(spec.mechanism, noise, sample_rate, steps, delta, clip=clip, params=params, ks=ks,
                             alpha=alpha, grid=grid, loss_step=loss_step)
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
        "alpha": alpha,
        "delta": delta,
        "claimed_epsilon": claimed,
        "lower_bound_epsilon": result.epsilon,
        "consistent": bool(result.epsilon <= claimed),
        "worst_pair": {"k": result.k, "direction": result.direction},
        "scan": result.scan,
        "warning": spec.warning,
    }
