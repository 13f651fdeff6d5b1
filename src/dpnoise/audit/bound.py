"""Check an accountant's claim against the exact PLD lower bound of a feasible worst-case pair."""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

from dpnoise.accounting import ACCOUNTANTS, UnsoundAccountantWarning, get_accountant
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.audit import pld

__all__ = ["audit_bound", "PLD_PAIR"]

#: accounting mechanism -> (PLD pair, factor on noise): the penultimate-layer Gaussian moves a
#: clipped activation by up to 2C, i.e. a Gaussian pair at multiplier sigma/2.
PLD_PAIR = {
    "gaussian": ("gaussian", 1.0),
    "laplace-l1": ("laplace-l1", 1.0),
    "lap2": ("lap2", 1.0),
    "dirichlet": ("dirichlet", 1.0),
    "penultimate-gaussian": ("gaussian", 0.5),
}


def audit_bound(
    accountant: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: Optional[int] = None, alpha: Optional[float] = None,
    ks: Optional[Sequence[int]] = None, grid: int = 1 << 21, loss_step: Optional[float] = None,
) -> dict:
    """claimed_epsilon of ``accountant`` vs the exact lower bound; consistent iff lower <= claimed."""
    spec = ACCOUNTANTS[accountant] if accountant in ACCOUNTANTS else None
    if spec is None:
        raise InvalidParameterError(f"unknown accountant {accountant!r}; choose from {sorted(ACCOUNTANTS)}")
    if spec.mechanism == "dirichlet" and alpha is None:
        alpha = 1.0
    acc = get_accountant(accountant)
    acc.step(noise, sample_rate, clip=clip, params=params, alpha=alpha, steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        claimed = float(acc.get_epsilon(delta))
    pair, factor = PLD_PAIR[spec.mechanism]
    result = pld.lower_bound(
        pair, noise * factor, sample_rate, steps, delta, clip=clip, params=params, ks=ks,
        alpha=alpha, grid=grid, loss_step=loss_step,
    )
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
