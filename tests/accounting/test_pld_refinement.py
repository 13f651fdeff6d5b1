"""The PLD route's passes: when a finer grid is computed, and what skipping it costs."""

import pytest

from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
from dpnoise.accounting.pld import distribution
from dpnoise.accounting.pld.distribution import CONVERGED, REFINEMENT, pld_epsilon


def _history(sigma, q, steps):
    return ((PoissonSampledEvent(q, GaussianEvent(sigma)), steps),)


def _finer_pass(history, delta):
    """epsilon on the grid REFINEMENT times finer than the first pass's, whatever the estimate says."""
    epsilon, grid, tilts = distribution._first_pass(history, delta)
    finer = distribution.history_discretization(history, grid / REFINEMENT)
    return epsilon, distribution._epsilon_on_grid(history, finer, delta, tilts)[0]


@pytest.mark.parametrize("sigma, q, steps, delta", [(1.0, 0.01, 1000, 1e-5), (0.7, 0.02, 300, 1e-5),
                                                    (3.0, 0.05, 2000, 1e-10)])
def test_a_skipped_refinement_costs_less_than_half_the_convergence_threshold(sigma, q, steps, delta):
    history = _history(sigma, q, steps)
    coarse, finer = _finer_pass(history, delta)
    reported = pld_epsilon(history, delta)[0]
    assert reported == coarse  # resolved on the first grid: no finer pass
    assert finer <= reported <= finer * (1 + CONVERGED / 2)


@pytest.mark.parametrize("sigma, q, steps, delta", [(1.1, 1e-4, 1000, 1e-5), (1.5, 1e-3, 1000, 1e-6)])
def test_a_grid_that_does_not_resolve_the_step_is_refined(sigma, q, steps, delta):
    history = _history(sigma, q, steps)
    coarse, finer = _finer_pass(history, delta)
    assert finer < coarse * (1 - CONVERGED)  # the first grid is far off here
    assert pld_epsilon(history, delta)[0] <= finer
