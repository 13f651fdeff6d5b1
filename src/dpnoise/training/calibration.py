"""Noise calibration and step budgets for training, on top of :mod:`dpnoise.accounting`."""

from __future__ import annotations

from typing import Optional, Sequence

from dpnoise.accounting import CalibrationResult, MechanismOptions, calibrate, epsilon_of_events
from dpnoise.accounting.events import DpEvent

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
    options: Optional[MechanismOptions] = None,
    releases: Sequence[DpEvent] = (),
    count_release: Optional[DpEvent] = None,
) -> CalibrationResult:
    """Smallest noise meeting (target_epsilon, delta) after ``steps`` steps, in the mechanism's units.

    Gaussian mechanisms: sigma; Laplace ones: absolute b for clipping norm ``clip`` (the Lap2 paper's
    Algorithm 1 for ``lap2``); a mechanism with its own calibrator (the Dirichlet r) by that
    (:func:`dpnoise.accounting.calibrate`).  Raises ``dpnoise.accounting.UnreachableTargetError``
    when the target is below the reachable floor.  ``releases``: events composed before the steps
    (gradient mechanisms only), covered by the target too; ``count_release``: adaptive clipping's noisy count,
    released with every step (:func:`dpnoise.accounting.calibration.calibrate_noise`).
    """
    return calibrate(accountant, target_epsilon, delta, sample_rate, steps, clip=clip, params=params,
                     options=options, releases=releases, count_release=count_release)


def steps_within_budget(accountant: str, step_event: DpEvent, target_epsilon: float, delta: float,
                        releases: Sequence[DpEvent] = (), start: int = 1) -> int:
    """Largest T with epsilon(``releases``, then T x ``step_event``) <= target_epsilon under ``accountant``
    (0 if one step already exceeds it).

    Epsilon is non-decreasing in T, so this gallops from ``start`` (a good guess: the planned steps
    the noise was calibrated for, where it usually takes two evaluations) by doubling strides up or
    down, and then bisects.
    """
    def fits(steps: int) -> bool:
        return epsilon_of_events(accountant, step_event, steps=steps, delta=delta, releases=releases) <= target_epsilon

    start = min(max(int(start), 1), MAX_BUDGET_STEPS)
    if fits(start):
        low, stride = start, 1  # fits(low); find a high that does not fit
        while low < MAX_BUDGET_STEPS and fits(min(low + stride, MAX_BUDGET_STEPS)):
            low, stride = min(low + stride, MAX_BUDGET_STEPS), 2 * stride
        if low >= MAX_BUDGET_STEPS:
            return MAX_BUDGET_STEPS
        high = min(low + stride, MAX_BUDGET_STEPS)
    else:
        high, stride = start, 1  # not fits(high); find a low that fits
        while high > 1 and not fits(max(high - stride, 1)):
            high, stride = max(high - stride, 1), 2 * stride
        if high == 1:
            return 0
        low = max(high - stride, 1)
    while high - low > 1:  # fits(low) and not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
