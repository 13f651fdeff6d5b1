"""Noise calibration and step budgets for training, on top of :mod:`dpnoise.accounting`."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dpnoise.accounting import (
    ACCOUNTANTS,
    CalibrationResult,
    calibrate_dirichlet_r,
    calibrate_noise,
    epsilon_after,
    get_mechanism_spec,
)
from dpnoise.accounting.events import DpEvent
from dpnoise.accounting.validation import InvalidParameterError

#: Upper end of the step search in :func:`steps_within_budget` (a budget never reached).
MAX_BUDGET_STEPS = 2**40


def calibrate_training_noise(
    accountant: str,
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    clip: float,
    params: int,
    alpha: Optional[float],
    releases: Sequence[DpEvent] = (),
) -> CalibrationResult:
    """Smallest noise meeting (target_epsilon, delta) after ``steps`` steps, in the mechanism's units.

    Gaussian mechanisms: sigma; Laplace ones: absolute b for clipping norm ``clip`` (the Lap2 paper's
    Algorithm 1 for ``lap2``); Dirichlet: the largest admissible r.  Raises
    ``dpnoise.accounting.UnreachableTargetError`` when the target is below the reachable floor.
    ``releases``: events composed before the steps (gradient mechanisms only), covered by the target too.
    """
    if get_mechanism_spec(ACCOUNTANTS[accountant].mechanism).uses_alpha:
        if releases:
            raise InvalidParameterError("releases before training are accounted for gradient mechanisms only")
        return calibrate_dirichlet_r(target_epsilon, delta, sample_rate, steps, alpha=alpha, accountant=accountant)
    return calibrate_noise(accountant, target_epsilon, delta, sample_rate, steps, clip=clip, params=params,
                           releases=releases)


def steps_within_budget(accountant: str, step_arguments: dict[str, Any], target_epsilon: float, delta: float,
                        releases: Sequence[DpEvent] = ()) -> int:
    """Largest T with epsilon(``releases``, then T steps) <= target_epsilon (0 if one step already exceeds it).

    Epsilon is non-decreasing in T, so this brackets by doubling and then bisects.
    """
    def fits(steps: int) -> bool:
        return epsilon_after(accountant, steps=steps, delta=delta, releases=releases,
                             **step_arguments) <= target_epsilon

    if not fits(1):
        return 0
    low = 1
    while low < MAX_BUDGET_STEPS and fits(2 * low):
        low *= 2
    if low >= MAX_BUDGET_STEPS:
        return MAX_BUDGET_STEPS
    high = 2 * low  # fits(low) and not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
