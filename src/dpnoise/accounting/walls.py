"""Privacy walls (Lap2 paper, Sec. IV-A, Figs. 3-4; docs/theory/lap2.md §8).

* Right wall: along the calibration curve noise(eps), the slope W_R(eps) = |d log noise / d log eps|
  (1 is the ideal noise ~ 1/eps scaling; the wall is where it departs).
* Left wall: at a fixed noise level, the first eps with delta_G(eps) > 2 delta_L2(eps).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from dpnoise.accounting.accountant import PrivacyAccountant, UnsoundAccountantWarning, get_accountant
from dpnoise.accounting.mechanisms import noise_keywords
from dpnoise.accounting.registry import get_spec


def _accountant(name: str, noise_multiplier: float, q: float, steps: int, params: int) -> PrivacyAccountant:
    """``name`` after ``steps`` steps at noise / C = ``noise_multiplier`` (C = 1)."""
    mechanism = get_spec(name).mechanism
    return get_accountant(name).step(sample_rate=q, clip=1.0, params=params, steps=steps,
                                     **noise_keywords(mechanism, noise_multiplier))


@dataclass(frozen=True)
class WallCurves:
    """Curves of one accountant at one sampling rate."""

    accountant: str
    sample_rate: float
    steps: int
    noise: np.ndarray  # noise multiplier grid (sigma, or b / C)
    epsilon: np.ndarray  # eps(delta) at each noise
    right_wall_slope: np.ndarray  # |d log noise / d log eps|
    delta_epsilons: np.ndarray  # eps grid for the delta curve
    delta_curve: np.ndarray  # delta(eps) at noise = ``fixed_noise``
    fixed_noise: float


def wall_curves(
    accountant: str,
    sample_rate: float,
    steps: int,
    params: int,
    delta: float,
    noise_grid: np.ndarray,
    delta_epsilons: np.ndarray,
    fixed_noise: float,
) -> WallCurves:
    """Noise-vs-epsilon (with W_R) over ``noise_grid`` and delta(eps) at ``fixed_noise``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        eps = np.array(
            [_accountant(accountant, s, sample_rate, steps, params).get_epsilon(delta) for s in noise_grid]
        )
        fixed = _accountant(accountant, fixed_noise, sample_rate, steps, params)
        deltas = np.array([fixed.get_delta(e) for e in delta_epsilons])
    finite = np.isfinite(eps) & (eps > 0)
    slope = np.full(eps.shape, np.nan)
    if finite.sum() >= 2:
        slope[finite] = np.abs(np.gradient(np.log(noise_grid[finite]), np.log(eps[finite])))
    return WallCurves(accountant, sample_rate, steps, np.asarray(noise_grid), eps, slope,
                      np.asarray(delta_epsilons), deltas, fixed_noise)


def left_wall(epsilons: np.ndarray, delta_gaussian: np.ndarray, delta_lap2: np.ndarray) -> Optional[float]:
    """First eps at which delta_G(eps) > 2 delta_L2(eps) (None if never)."""
    hit = np.flatnonzero(np.asarray(delta_gaussian) > 2 * np.asarray(delta_lap2))
    return float(np.asarray(epsilons)[hit[0]]) if hit.size else None
