"""What the round-off bound of a composed PLD rests on, checked where a composition could escape it.

* The tilted FFT composition (:mod:`dpnoise.accounting.pld.tilted`): every entry bound it reports
  covers the exact composition of the single-step PMFs (direct convolutions of nonnegative terms,
  relative error ~1e-13), at every tilt, also when the FFT's output is off by its whole entry
  error bound in the unfavourable direction.
* The single-step relative error rho (``SINGLE_STEP_RELATIVE_ERROR``) must bound the error of every
  upper tail sum of the single-step PMF (the convolution argument of docs/theory/pld_roundoff.md
  needs tail sums, not single masses: dp_accounting's masses at negative losses are second
  differences of delta values near 1 - e^eps, off by up to 100%).
* The loss sum is a BLAS dot product, not a pairwise sum.
References: exact masses with mpmath (40 digits).
"""

import math
from unittest import mock

import mpmath as mp
import numpy as np
import pytest

from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
from dpnoise.accounting.pld import distribution, tilted
from dpnoise.accounting.pld.roundoff import SINGLE_STEP_RELATIVE_ERROR, UNIT_ROUNDOFF, summation_error_factor

GRID = 0.02


def _direct_composition(steps):
    """(lowest loss index, masses) of the exact-order composition by direct convolutions."""
    lowest, masses = 0, np.ones(1)
    for pmf, count in steps:
        for _ in range(count):
            masses = np.convolve(masses, pmf.probs)
            lowest += pmf.lower
    return lowest, masses


def _steps(direction: int):
    """Two different Poisson-sampled Gaussian steps, 30 and 12 times: both kinds of factor."""
    history = ((PoissonSampledEvent(0.2, GaussianEvent(1.0)), 30), (PoissonSampledEvent(0.5, GaussianEvent(2.0)), 12))
    return distribution._directions(history, GRID)[direction]


def _reference_delta(lowest, masses, infinity_mass, epsilon):
    losses = GRID * (lowest + np.arange(masses.size))
    above = losses > epsilon
    return infinity_mass + float(-np.expm1(epsilon - losses[above]) @ masses[above])


def _assert_covers(bounded, lowest, masses, steps):
    indices = np.round(bounded.losses / GRID).astype(int) - lowest
    held = (indices >= 0) & (indices < masses.size)
    assert np.all(bounded.probs[held] >= masses[indices[held]] * (1 - 1e-12))
    infinity_mass = tilted._composed_infinity_mass(steps)
    for epsilon in np.linspace(max(bounded.floor, 0.0), float(bounded.losses[-1]), 12):
        assert bounded.delta_upper_bound(epsilon) >= _reference_delta(lowest, masses, infinity_mass, epsilon)


@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize("tilt", [0.0, 0.7, 3.0, 12.0])
def test_tilted_composition_covers_the_exact_composition(tilt, direction):
    steps = _steps(direction)
    lowest, masses = _direct_composition(steps)
    bounded = tilted.tilted_composition(steps, GRID, tilt)
    _assert_covers(bounded, lowest, masses, steps)
    # Not vacuous: near the tilted mean the bounds are within 1e-6 of the masses.
    centre = tilted._tilted_moments(steps, tilt, GRID)[0]
    index = int(np.argmin(np.abs(bounded.losses - centre)))
    exact = masses[int(round(bounded.losses[index] / GRID)) - lowest]
    assert bounded.probs[index] <= exact * (1 + 1e-6)


@pytest.mark.parametrize("tilt", [0.0, 3.0])
def test_fft_output_off_by_its_whole_error_bound_is_still_covered(tilt):
    """Lower every entry of the inverse FFT by (almost) its proven error bound: the reported bounds
    must still cover the exact composition (they add the bound back before untilting)."""
    steps = _steps(0)
    lowest, masses = _direct_composition(steps)
    reported = {}
    bound_function, inverse = tilted.power_product_entry_error, tilted.scipy_fft.ifft

    def record(*args):
        reported["error"] = bound_function(*args)
        return reported["error"]

    with mock.patch.object(tilted, "power_product_entry_error", record):
        tilted.tilted_composition(steps, GRID, tilt)
    error = reported["error"]
    with mock.patch.object(tilted.scipy_fft, "ifft", lambda spectrum: inverse(spectrum) - 0.999 * error), \
            mock.patch.object(tilted, "power_product_entry_error", lambda *args: error):
        perturbed = tilted.tilted_composition(steps, GRID, tilt)
    _assert_covers(perturbed, lowest, masses, steps)


def test_window_charges_the_mass_above_it():
    """A window cut short: the mass above it is charged to the infinity mass (Chernoff bound)."""
    steps = _steps(0)
    lowest, masses = _direct_composition(steps)
    with mock.patch.object(tilted, "WINDOW_DEVIATIONS", 0.5):
        bounded = tilted.tilted_composition(steps, GRID, 0.7)
    top = int(round(bounded.losses[-1] / GRID)) - lowest
    assert top < masses.size - 1  # the window ends below the composition's support
    assert bounded.infinity_mass >= masses[top + 1:].sum()
    _assert_covers(bounded, lowest, masses, steps)


def _gaussian_remove_delta(epsilon, sigma):
    """Exact delta(eps) of N(-1, s^2) vs N(0, s^2) (dp_accounting's remove direction at q = 1)."""
    x = -mp.mpf(1) / 2 - epsilon * sigma * sigma
    return mp.ncdf((x + 1) / sigma) - mp.exp(epsilon) * mp.ncdf(x / sigma)


def test_single_step_tail_sums_are_within_the_relative_error():
    """The connect-the-dots PMF's tail sums sum_{i >= j} p_i + p_inf telescope to
    delta_j + (delta_{j-1} - delta_j) / (1 - e^-h); dp_accounting's are within rho of them."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    mp.mp.dps = 40
    sigma, h = 8.0, 1e-3
    pmf = pld_lib.from_gaussian_mechanism(sigma, pessimistic_estimate=True, value_discretization_interval=h,
                                          sampling_prob=1.0)._pmf_remove.to_dense_pmf()
    probs = np.asarray(pmf._probs)
    tails = np.cumsum(probs[::-1])[::-1] + pmf._infinity_mass
    s, step = mp.mpf(sigma), mp.mpf(h)
    worst = 0.0
    for j in range(1, probs.size, 3):
        loss = (pmf._lower_loss + j) * step
        here, below = _gaussian_remove_delta(loss, s), _gaussian_remove_delta(loss - step, s)
        exact = here + (below - here) / -mp.expm1(-step)
        worst = max(worst, float(1 - mp.mpf(tails[j]) / exact))
    assert worst <= SINGLE_STEP_RELATIVE_ERROR / 100


def test_summation_allowance_holds_for_any_summation_order():
    """``weights @ masses`` is a BLAS dot product (blocked, not pairwise): its relative error on
    nonnegative terms is bounded by gamma_n = n u / (1 - n u) only (Higham 2002, Sec. 3.1)."""
    for count in (10, 10_000, 4_000_000):
        assert summation_error_factor(count) >= count * UNIT_ROUNDOFF / (1 - count * UNIT_ROUNDOFF)
    assert math.isfinite(summation_error_factor(4 * distribution.MAX_COMPOSED_POINTS))


def _sampled_gaussian_delta(epsilon, sigma, q, direction):
    """Exact delta(eps) of dp_accounting's two directions of the Poisson-sampled Gaussian:
    remove, (1 - q) N(0, s^2) + q N(-1, s^2) vs N(0, s^2); add, N(0, s^2) vs that mixture."""
    grow = mp.exp(epsilon) if direction == "remove" else mp.exp(-epsilon)
    if grow <= 1 - q:
        return 1 - mp.exp(epsilon) if direction == "remove" else mp.mpf(0)
    x = -mp.mpf(1) / 2 - sigma * sigma * mp.log((grow - 1 + q) / q)
    if direction == "remove":
        return q * mp.ncdf((x + 1) / sigma) - (mp.exp(epsilon) - 1 + q) * mp.ncdf(x / sigma)
    upper = lambda t: 1 - mp.ncdf(t / sigma)  # noqa: E731
    return upper(x) - mp.exp(epsilon) * ((1 - q) * upper(x) + q * upper(x + 1))


@pytest.mark.parametrize("sigma,q,grid", [(1.0, 1e-8, 1e-6), (1.0, 1e-4, 1.5e-5), (0.05, 1e-6, 4e-3)])
def test_sampled_single_step_tail_sums_are_within_the_relative_error(sigma, q, grid):
    """As above, for the Poisson-sampled Gaussian at the grids the route takes at small q: the finest
    (1e-6, where a step's losses are ~1e-8), a fine grid at the single-step size limit, and the coarse
    grid of a wide support (sigma 0.05)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    mp.mp.dps = 50
    pld = pld_lib.from_gaussian_mechanism(sigma, pessimistic_estimate=True, value_discretization_interval=grid,
                                          sampling_prob=q)
    s, step, rate = mp.mpf(sigma), mp.mpf(grid), mp.mpf(q)
    for direction in ("remove", "add"):
        pmf = getattr(pld, f"_pmf_{direction}").to_dense_pmf()
        probs = np.asarray(pmf._probs)
        tails = np.cumsum(probs[::-1])[::-1] + pmf._infinity_mass
        worst = 0.0
        for j in np.unique(np.linspace(1, probs.size - 1, 60).astype(int)):
            loss = (pmf._lower_loss + j) * step
            here = _sampled_gaussian_delta(loss, s, rate, direction)
            below = _sampled_gaussian_delta(loss - step, s, rate, direction)
            exact = here + (below - here) / -mp.expm1(-step)
            if exact > 0:
                worst = max(worst, float(1 - mp.mpf(tails[j]) / exact))
        assert worst <= SINGLE_STEP_RELATIVE_ERROR / 10, direction
