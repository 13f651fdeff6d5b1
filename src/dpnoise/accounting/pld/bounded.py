"""A composed privacy loss distribution whose epsilon(delta) and delta(epsilon) are proven bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpnoise.accounting.pld.roundoff import summation_error_factor

_CELL_SOLVE_MARGIN = 1e-9
# Largest exponent of the weights within a block of the suffix sums.
_BLOCK_EXPONENT = 30.0


def _discounted_suffix_sums(masses: np.ndarray, step: float) -> np.ndarray:
    """tail[k] = sum_{i >= k} e^{-(i - k) step} masses[i] (the recurrence tail[k] = c_k + e^-step tail[k+1]),
    by blocks over which the weights e^{-i step} stay above e^-30 (no underflow of a weighted mass): sums
    of nonnegative terms, used only to locate the cell, whose epsilon is then certified directly.
    (NumPy only: scipy.signal's lfilter would load scipy.stats, a slow import.)"""
    tail = np.empty_like(masses)
    block = max(1, int(_BLOCK_EXPONENT / step))
    carry = 0.0
    for end in range(masses.size, 0, -block):
        start = max(0, end - block)
        weights = np.exp(-step * np.arange(end - start))
        tail[start:end] = (np.cumsum((masses[start:end] * weights)[::-1])[::-1]
                           + carry * math.exp(-step * (end - start))) / weights
        carry = float(tail[start])
    return tail


@dataclass(frozen=True)
class BoundedPmf:
    """One direction of a composed PLD as proven upper bounds on its masses.

    ``probs[i]`` bounds the mass of the exact composition of the computed single-step PMFs at loss
    ``losses[i]`` (ascending, on the grid); the mechanism's masses are at most ``1 + relative_error``
    times those (the single-step PMFs' rounding); ``infinity_mass`` bounds the mass at +inf plus any
    mass above the last loss.  Losses below ``floor`` are not held: no epsilon below it is certified.
    """

    losses: np.ndarray
    probs: np.ndarray
    infinity_mass: float
    relative_error: float
    floor: float = -math.inf

    def _loss_budget(self, delta: float) -> float:
        """The largest sum_{l > eps} (1 - e^{eps - l}) p(l), as computed, that still certifies ``delta``."""
        budget = delta / (1.0 + self.relative_error) - self.infinity_mass
        return budget / (1.0 + summation_error_factor(4 * self.probs.size))

    def _computed_loss_sum(self, epsilon: float) -> float:
        start = int(np.searchsorted(self.losses, epsilon, side="right"))
        weights = -np.expm1(epsilon - self.losses[start:])
        return float(weights @ self.probs[start:])

    def delta_upper_bound(self, epsilon: float) -> float:
        """A proven upper bound on the hockey-stick divergence at ``epsilon`` of the exact PLD (1 below ``floor``)."""
        if epsilon < self.floor:
            return 1.0
        loss_sum = self._computed_loss_sum(epsilon) * (1.0 + summation_error_factor(4 * self.probs.size))
        return (1.0 + self.relative_error) * (self.infinity_mass + loss_sum)

    def epsilon_upper_bound(self, delta: float) -> float:
        """The smallest epsilon >= max(0, ``floor``) (to rounding, never below) whose :meth:`delta_upper_bound`
        is <= ``delta``.

        Locates the grid cell with suffix sums without cancellation,
        S(l_j) = sum_{k > j} (1 - e^{-h}) (c_k + B_k), B_k = sum_{i > k} e^{-(l_i - l_k)} c_i
        (a decaying linear recurrence), solves S(l_j + t) = S(l_j) + E_j (1 - e^t), t in [-h, 0],
        in the cell, and certifies the result by direct evaluation.
        """
        budget = self._loss_budget(delta)
        if budget < 0:
            return math.inf
        masses, lowest = self.probs, max(0.0, self.floor)
        if masses.size == 0 or self._computed_loss_sum(lowest) <= budget:
            return lowest
        step = float(self.losses[1] - self.losses[0]) if masses.size > 1 else 1.0
        # tail[k] = c_k + B_k = sum_{i >= k} e^{-(l_i - l_k)} c_i, computed from the top down.
        tail = _discounted_suffix_sums(masses, step)
        # grid_sums[j] = S(l_j) = (1 - e^{-h}) sum_{k > j} tail[k]
        grid_sums = -math.expm1(-step) * np.concatenate([np.cumsum(tail[::-1])[::-1][1:], [0.0]])
        j = int(np.argmax(grid_sums <= budget))
        candidates = []
        if j > 0:
            # Aimed a hair below the budget, so that the rounding of the direct check cannot refuse it.
            gap = (budget * (1.0 - _CELL_SOLVE_MARGIN) - grid_sums[j]) / tail[j]
            candidates.append(float(self.losses[j]) + math.log1p(-min(max(gap, 0.0), -math.expm1(-step))))
        candidates += [float(loss) for loss in self.losses[j:j + 8]]
        for epsilon in candidates:
            epsilon = max(epsilon, lowest)
            if self._computed_loss_sum(epsilon) <= budget:
                return epsilon
        return float(self.losses[-1])


@dataclass(frozen=True)
class ComposedPld:
    """A composed PLD (both directions) whose epsilon(delta) and delta(epsilon) are proven bounds."""

    directions: tuple[BoundedPmf, ...]

    def epsilon_for_delta(self, delta: float) -> float:
        return max(direction.epsilon_upper_bound(delta) for direction in self.directions)

    def delta_for_epsilon(self, epsilon: float) -> float:
        return max(direction.delta_upper_bound(epsilon) for direction in self.directions)
