"""Step budgets: the largest number of steps within a target epsilon, from any starting guess."""

import pytest

from dpnoise.accounting import epsilon_after, step_event_from_keywords
from dpnoise.training.calibration import steps_within_budget

ARGUMENTS = dict(mechanism="gaussian", sample_rate=0.01, noise_multiplier=1.1, clip=1.0, params=10)
STEP = step_event_from_keywords(**ARGUMENTS)


def fits(steps: int, target: float) -> bool:
    return epsilon_after("gaussian-rdp", steps=steps, delta=1e-5, **ARGUMENTS) <= target


@pytest.mark.parametrize("start", [1, 137, 500, 911, 5000, 2**41])
def test_the_budget_is_the_same_largest_step_count_from_any_start(start):
    budget = steps_within_budget("gaussian-rdp", STEP, 2.0, 1e-5, start=start)
    assert budget == steps_within_budget("gaussian-rdp", STEP, 2.0, 1e-5)
    assert 100 < budget < 5000 and fits(budget, 2.0) and not fits(budget + 1, 2.0)


def test_a_budget_below_one_step_is_zero_from_any_start():
    for start in (1, 50):
        assert steps_within_budget("gaussian-rdp", STEP, 1e-3, 1e-5, start=start) == 0
