"""What the round-off bound of a composed PLD rests on, checked where a composition could escape it.

* The tilted FFT composition (:mod:`dpnoise.accounting.pld.tilted`): every entry bound it reports
  covers the exact composition of the single-step PMFs (direct convolutions of nonnegative terms,
  relative error ~1e-13), at every tilt, also when the FFT's output is off by its whole entry
  error bound in the unfavourable direction.
* Each single-step PMF's proven relative error rho (``GridPmf.tail_relative_error``) must bound the
  error of every upper tail sum (the convolution argument of docs/theory/pld_roundoff.md needs tail
  sums, not single masses), here with a margin of 10 against 50-digit mpmath.
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
from dpnoise.accounting.pld.roundoff import UNIT_ROUNDOFF, summation_error_factor
from dpnoise.accounting.pld.single_step import gaussian_pmfs, laplace_pmfs

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
    bound_function, inverse = tilted.power_product_entry_error, tilted.numpy_fft.ifft

    def record(*args):
        reported["error"] = bound_function(*args)
        return reported["error"]

    with mock.patch.object(tilted, "power_product_entry_error", record):
        tilted.tilted_composition(steps, GRID, tilt)
    error = reported["error"]
    with mock.patch.object(tilted.numpy_fft, "ifft", lambda spectrum: inverse(spectrum) - 0.999 * error), \
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


def _sampled_laplace_delta(epsilon, scale, q, direction):
    """Exact delta(eps) of the two directions of the Poisson-sampled Laplace (same convention):
    H_{e^t}(P||Q) = 1 - e^t + e^t H_{e^-t}(Q||P) gives the add direction from the remove one."""
    def remove(t):
        c = (mp.exp(t) - 1 + q) / q
        if c <= 0:
            return 1 - mp.exp(t)
        loss, top = mp.log(c), 1 / scale
        unsampled = 1 - mp.exp(loss) if loss < -top else (1 - mp.exp((loss - top) / 2) if loss < top else mp.mpf(0))
        return q * unsampled
    if direction == "remove":
        return remove(epsilon)
    return 1 - mp.exp(epsilon) + mp.exp(epsilon) * remove(-epsilon)


def _worst_tail_error(pmf, grid, exact_delta):
    """Largest relative shortfall of the PMF's tail sums S_j below delta_j + (delta_{j-1} - delta_j) / (1 - e^-h),
    less the rounding of the float64 sums here (n u: the proof sums the stored masses exactly)."""
    tails = np.cumsum(pmf.probs.astype(np.longdouble)[::-1])[::-1] + pmf.infinity_mass
    step, worst = mp.mpf(grid), 0.0
    for j in np.unique(np.linspace(1, pmf.probs.size - 1, 80).astype(int)):
        loss = (pmf.lower + int(j)) * step
        here, below = exact_delta(loss), exact_delta(loss - step)
        exact = here + (below - here) / -mp.expm1(-step)
        if exact > 0:
            worst = max(worst, float(1 - mp.mpf(float(tails[j])) / exact))
    return worst - pmf.probs.size * UNIT_ROUNDOFF


GAUSSIAN_SETTINGS = [(1.0, 1e-8, 1e-6), (1.0, 1e-4, 1.5e-5), (0.05, 1e-6, 4e-3), (8.0, 1.0, 1e-3), (30.0, 1e-3, 1e-5),
                     (0.8, 0.004, 2e-4), (4.0, 1e-3, 1e-3), (2.0, 0.5, 1e-4)]


@pytest.mark.parametrize("sigma,q,grid", GAUSSIAN_SETTINGS)
def test_gaussian_tail_sums_are_within_a_tenth_of_their_proven_error(sigma, q, grid):
    """The single-step PMFs' tail sums against 50-digit mpmath, at the grids the route takes: the finest
    (1e-6, where a step's losses are ~1e-8), fine grids at small q, the coarse grid of a wide support
    (sigma 0.05), q = 1 and q close to 1."""
    mp.mp.dps = 50
    s, rate = mp.mpf(sigma), mp.mpf(q)
    for direction, pmf in zip(("remove", "add"), gaussian_pmfs(sigma, q, grid)):
        assert pmf.tail_relative_error < 1e-9
        worst = _worst_tail_error(pmf, grid, lambda e: _sampled_gaussian_delta(e, s, rate, direction))
        assert worst <= pmf.tail_relative_error / 10, direction


@pytest.mark.parametrize("scale,q,grid", [(2.0, 0.01, 1e-3), (1.0, 1.0, 1e-3), (0.3, 0.05, 1e-4), (50.0, 1e-4, 1e-6)])
def test_laplace_tail_sums_are_within_a_tenth_of_their_proven_error(scale, q, grid):
    mp.mp.dps = 50
    b, rate = mp.mpf(scale), mp.mpf(q)
    for direction, pmf in zip(("remove", "add"), laplace_pmfs(scale, q, grid)):
        worst = _worst_tail_error(pmf, grid, lambda e: _sampled_laplace_delta(e, b, rate, direction))
        assert worst <= pmf.tail_relative_error / 10, direction


@pytest.mark.parametrize("kind,noise,q,grid", [("gaussian", 1.0, 0.01, 1e-3), ("gaussian", 4.0, 1e-3, 1e-4),
                                               ("gaussian", 0.8, 1.0, 1e-3), ("laplace", 2.0, 0.01, 1e-3),
                                               ("laplace", 0.3, 0.05, 1e-4)])
def test_tail_sums_agree_with_dp_accountings_pessimistic_pld(kind, noise, q, grid):
    """The same connect-the-dots discretisation as dp_accounting's: tail sums within 1e-6 wherever
    dp_accounting's own are accurate (tails above 1e-9; its support is cut a little narrower)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    build = pld_lib.from_gaussian_mechanism if kind == "gaussian" else pld_lib.from_laplace_mechanism
    reference = build(noise, pessimistic_estimate=True, value_discretization_interval=grid, sampling_prob=q)
    ours = (gaussian_pmfs if kind == "gaussian" else laplace_pmfs)(noise, q, grid)
    for pmf, theirs in zip(ours, (reference._pmf_remove, reference._pmf_add)):
        dense = theirs.to_dense_pmf()
        their_probs = np.asarray(dense._probs)
        their_tails = np.cumsum(their_probs[::-1])[::-1] + dense._infinity_mass
        our_tails = np.cumsum(pmf.probs[::-1])[::-1] + pmf.infinity_mass
        low = max(pmf.lower, dense._lower_loss) + 1  # both put the truncated bottom on their lowest point
        high = min(pmf.lower + pmf.probs.size, dense._lower_loss + their_probs.size)
        mine, other = our_tails[low - pmf.lower:high - pmf.lower], their_tails[low - dense._lower_loss:high - dense._lower_loss]
        held = other > 1e-9
        assert held.sum() > 5
        assert np.max(np.abs(mine[held] / other[held] - 1)) <= 1e-6
