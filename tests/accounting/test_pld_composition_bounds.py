"""What the round-off bound of a composed PLD rests on, checked where a composition could escape it.

* dp_accounting's composition of two different PMFs (``DensePLDPmf.compose``) truncates its tails
  by summing *computed* masses: the truncated entries' round-off must be charged too.
* The single-step relative error rho (``SINGLE_STEP_RELATIVE_ERROR``) must bound the error of every
  upper tail sum of the single-step PMF (the convolution argument of docs/theory/pld_roundoff.md
  needs tail sums, not single masses: dp_accounting's masses at negative losses are second
  differences of delta values near 1 - e^eps, off by up to 100%).
* The loss sum is a BLAS dot product, not a pairwise sum.
References: exact masses with mpmath (40 digits); dp_accounting's own FFT as the "exact" masses
where an error within the claimed entry bound is injected.
"""

import math
from unittest import mock

import mpmath as mp
import numpy as np
import scipy.signal

from dpnoise.accounting.events import GaussianEvent, PoissonSampledEvent
from dpnoise.accounting.pld import distribution
from dpnoise.accounting.pld.roundoff import SINGLE_STEP_RELATIVE_ERROR, UNIT_ROUNDOFF, summation_error_factor


def _reference_delta(pmf, epsilon: float) -> float:
    above = pmf.losses > epsilon
    return pmf.infinity_mass + float(-np.expm1(epsilon - pmf.losses[above]) @ np.maximum(pmf.probs[above], 0.0))


def test_round_off_of_the_entries_compose_truncates_is_charged():
    """Inject into the composition of two different PMFs an error the entry bound allows (minus the
    bound on the top entries): dp_accounting then truncates many more entries into the infinity mass
    at their computed (too small) value.  The bound must still cover the unperturbed composition."""
    history = ((PoissonSampledEvent(0.01, GaussianEvent(1.0)), 60), (PoissonSampledEvent(0.02, GaussianEvent(1.5)), 40))
    distribution.composed_pld.cache_clear()
    reference = distribution.composed_pld(history, distribution.COARSE_DISCRETIZATION)
    error = min(direction.entry_error for direction in reference.directions)
    convolve = scipy.signal.fftconvolve

    def rounded_down(a, b, *args, **kwargs):
        out = convolve(a, b, *args, **kwargs)
        out[-3000:] -= error
        return out

    distribution.composed_pld.cache_clear()
    try:
        with mock.patch.object(scipy.signal, "fftconvolve", rounded_down):
            perturbed = distribution.composed_pld(history, distribution.COARSE_DISCRETIZATION)
    finally:
        distribution.composed_pld.cache_clear()
    assert perturbed.directions[0].probs.size < reference.directions[0].probs.size - 1000  # truncated deeper
    for exact, bounded in zip(reference.directions, perturbed.directions):
        for epsilon in bounded.losses[-1] - np.array([1.0, 0.5, 0.2]):
            assert bounded.delta_upper_bound(epsilon) >= _reference_delta(exact, epsilon)


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
