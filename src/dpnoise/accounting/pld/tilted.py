"""Composition of discretised PLDs by exponentially tilted FFTs, with a proven round-off bound.

An FFT's round-off is absolute: about 1e-16 of the total mass on every entry of the composed PMF
(docs/theory/pld_roundoff.md).  Summed over the entries above epsilon it is of the order of the
deltas users ask for (1e-8 to 1e-15) after 10^4 to 10^6 steps, and a proven bound on it then
exceeds delta itself.  Tilting (the Esscher transform) moves the FFT's accuracy to the tail that
sets epsilon: with

    p_lam(l) = p(l) e^{lam l} / Z(lam),   Z(lam) = sum_l p(l) e^{lam l},

tilting commutes with convolution ((p * r)_lam = p_lam * r_lam, Z_{p*r} = Z_p Z_r), so the
T-fold composition is the FFT composition of the tilted PMFs (each of total mass 1), untilted entry
by entry: p^{*T}(l) = Z^T e^{-lam l} p_lam^{*T}(l).  An absolute error e of the tilted composition
is an error e Z^T e^{-lam l} at loss l; at the saddle point of the tail at epsilon (the lam whose
tilted mean is epsilon), Z^T e^{-lam epsilon} is the Chernoff bound on that tail, within a small
factor of delta: the error is relative to delta, not to 1.

A circular FFT of length L folds the tilted composition modulo L.  The window it keeps holds every
loss in [floor, floor + (L - 1) h]; mass outside it lands, positive, on entries inside (it can only
raise delta); the mass above the window is missing from where it belongs and is charged to the
infinity mass by a Chernoff bound, min over lam' of Z(lam')^T e^{-lam' top}; losses below the
window are not held, so no epsilon below ``floor`` is certified (:class:`BoundedPmf`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Optional, Sequence

import numpy as np
from numpy import fft as numpy_fft

from dpnoise.accounting.pld.bounded import BoundedPmf
from dpnoise.accounting.pld.roundoff import (
    UNIT_ROUNDOFF,
    composition_relative_error,
    fft_error_factor,
    power_product_entry_error,
)

#: Half-width of the composed window in standard deviations of the tilted composition.
WINDOW_DEVIATIONS = 12.0
# Range of tilts searched (lam = 0 is no tilt).
_MAX_TILT = 1e6
_TILT_TOLERANCE = 0.01


@dataclass(frozen=True)
class GridPmf:
    """One direction of a single-step PLD on the grid l_i = (lower + i) h: masses >= 0 and the infinity mass.

    ``tail_relative_error`` rho: every upper tail sum sum_{i >= j} p_i + infinity mass is at least (1 - rho)
    times that of the exact (pessimistic) discretisation it stands for (docs/theory/pld_roundoff.md).
    """

    lower: int
    probs: np.ndarray
    infinity_mass: float
    tail_relative_error: float = 0.0

    @cached_property
    def finite_mass(self) -> float:
        return float(self.probs.sum())

    @cached_property
    def loss_indices(self) -> np.ndarray:
        return self.lower + np.arange(self.probs.size)

    @cached_property
    def log_probs(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.probs)


#: A ledger direction: the single-step PMF of each event with its number of compositions.
Steps = Sequence[tuple[GridPmf, int]]


def _tilted_log_weights(pmf: GridPmf, tilt: float, grid: float) -> tuple[np.ndarray, float]:
    """(log p_lam(l_i), log Z(lam)) of the finite part of ``pmf``."""
    log_weights = pmf.log_probs + tilt * grid * pmf.loss_indices
    log_z = _log_sum_exp(log_weights)
    return log_weights - log_z, log_z


def _log_sum_exp(values: np.ndarray) -> float:
    """log sum e^values (-inf for no finite value); cheaper than scipy's, which checks array backends per call."""
    top = float(np.max(values))
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.sum(np.exp(values - top))))


def fast_length(size: int) -> int:
    """The smallest 2^a 3^b 5^c >= ``size``: an FFT length pocketfft transforms fast."""
    best, power_of_five = 2 * size, 1
    while power_of_five < 2 * size:
        power_of_three = power_of_five
        while power_of_three < 2 * size:
            length = power_of_three
            while length < size:
                length *= 2
            best = min(best, length)
            power_of_three *= 3
        power_of_five *= 5
    return best


def log_mgf(steps: Steps, tilt: float, grid: float) -> float:
    """K(lam) = sum over steps of count x log Z(lam): the log moment generating function of the
    composed finite part."""
    return sum(count * _tilted_log_weights(pmf, tilt, grid)[1] for pmf, count in steps)


def _cumulants(steps: Steps, tilt: float, grid: float) -> tuple[float, float, float]:
    """(K(lam), K'(lam), K''(lam)): the log MGF and the mean and variance of the composed loss under the tilt."""
    log_z = mean = variance = 0.0
    for pmf, count in steps:
        log_weights, step_log_z = _tilted_log_weights(pmf, tilt, grid)
        weights = np.exp(log_weights)
        step_mean = float(weights @ pmf.loss_indices) * grid
        centred = pmf.loss_indices * grid - step_mean
        log_z += count * step_log_z
        mean += count * step_mean
        variance += count * float(weights @ (centred * centred))
    return log_z, mean, variance


def _tilted_moments(steps: Steps, tilt: float, grid: float) -> tuple[float, float]:
    """Mean and variance of the composed loss under the tilt (K'(lam), K''(lam))."""
    return _cumulants(steps, tilt, grid)[1:]


def _solve_tilt(evaluate: Callable[[float], tuple[float, float]], target: float, near: Optional[float] = None) -> float:
    """The lam in [0, _MAX_TILT] where an increasing function reaches ``target``, to _TILT_TOLERANCE in
    log10 lam.  ``evaluate(lam)`` gives (value, d value / d lam).

    Brackets in log10 lam (within half a decade of ``near`` first, where that brackets it), then takes
    Newton steps in log lam, bisecting wherever a step leaves the bracket.  Any tilt gives a proven
    bound; how close it is to the saddle point only sets how tight."""
    value = lambda exponent: evaluate(10.0**exponent)[0]  # noqa: E731
    if evaluate(0.0)[0] >= target:
        return 0.0
    low, high = -12.0, math.log10(_MAX_TILT)
    if near is not None and near > 0:
        centre = math.log10(near)
        if value(centre - 0.5) < target <= value(centre + 0.5):
            low, high = centre - 0.5, centre + 0.5
    if high == math.log10(_MAX_TILT) and value(high) < target:
        return 10.0**high
    exponent = 0.5 * (low + high)
    while high - low > _TILT_TOLERANCE:
        current, slope = evaluate(10.0**exponent)
        if current >= target:
            high = exponent
        else:
            low = exponent
        # d value / d log10 lam = lam ln(10) d value / d lam
        scale = slope * 10.0**exponent * math.log(10.0)
        step = (target - current) / scale if scale > 0 else math.inf
        if abs(step) < _TILT_TOLERANCE / 4:
            return 10.0 ** min(max(exponent + step, low), high)
        exponent = exponent + step if low < exponent + step < high else 0.5 * (low + high)
    return 10.0**high


def tilt_centred_at(steps: Steps, grid: float, loss: float) -> float:
    """The tilt lam >= 0 whose tilted composed mean K'(lam) is ``loss`` (0 when the mean is above it)."""
    return _solve_tilt(lambda tilt: _cumulants(steps, tilt, grid)[1:], loss)


def tilt_for_delta(steps: Steps, grid: float, delta: float, near: Optional[float] = None) -> float:
    """The saddle point of the Chernoff bound on epsilon(delta): min over lam of (K(lam) - log delta) / lam
    is attained where lam K'(lam) - K(lam) = -log delta (the left side increases with lam: its derivative
    is lam K''(lam)).  ``near``: a tilt found before (a coarser grid's), where the search starts."""
    def saddle_equation(tilt: float) -> tuple[float, float]:
        log_z, mean, variance = _cumulants(steps, tilt, grid)
        return tilt * mean - log_z, tilt * variance

    return _solve_tilt(saddle_equation, -math.log(delta), near)


def log_chernoff_tail(steps: Steps, grid: float, loss: float, tilt: float) -> float:
    """log of a proven bound on the composed finite mass above ``loss``: min over lam' >= lam of
    K(lam') - lam' loss (Markov's inequality on e^{lam' L}), searched on a geometric grid."""
    candidates = tilt * np.geomspace(1.0, 1e3, 31) if tilt > 0 else np.geomspace(1e-6, 1e3, 31)
    return min(log_mgf(steps, float(c), grid) - float(c) * loss for c in candidates)


def _composed_infinity_mass(steps: Steps) -> float:
    """Mass of the composition with at least one infinite loss: prod (f + m)^T - prod f^T."""
    log_finite = sum(count * math.log(pmf.finite_mass) for pmf, count in steps)
    log_ratio = sum(count * math.log1p(pmf.infinity_mass / pmf.finite_mass) for pmf, count in steps)
    return math.exp(log_finite) * math.expm1(log_ratio)


def _window(steps: Steps, tilt: float, grid: float) -> tuple[int, int]:
    """(first loss index, FFT length) of the window around the tilted composed mean."""
    mean, variance = _tilted_moments(steps, tilt, grid)
    half_width = WINDOW_DEVIATIONS * math.sqrt(variance) / grid
    widest_step = max(pmf.probs.size for pmf, _ in steps)
    # above the mean, room for one more step's whole support (skewed compositions of rare large losses)
    first = max(_lowest(steps), math.floor(mean / grid - half_width))
    last = min(_highest(steps), math.ceil(mean / grid + half_width) + widest_step)
    return first, fast_length(max(last - first + 1, widest_step))


def composed_window_length(steps: Steps, tilt: float, grid: float) -> int:
    """The FFT length :func:`tilted_composition` would use."""
    return _window(steps, tilt, grid)[1]


def tilted_composition(steps: Steps, grid: float, tilt: float) -> BoundedPmf:
    """The composition of ``steps`` (one direction) as a :class:`BoundedPmf` of proven entry bounds.

    Entries hold bounds on the exact composition of the given PMFs: (tilted FFT result + its entry
    error bound e) x Z^T e^{-lam l}, each at most the composition's total mass; relative errors
    of the tilting and untilting exponentials and of the single-step PMFs go to ``relative_error``.
    """
    first, length = _window(steps, tilt, grid)
    lowest = _lowest(steps)
    spectra, log_z_total, counts, forward_errors, exponent_size = [], 0.0, [], [], 0.0
    gamma = fft_error_factor(length)
    half = length // 2 + 1  # the spectra of real inputs are conjugate-symmetric: powers on half of them
    for pmf, count in steps:
        log_tilted, log_z = _tilted_log_weights(pmf, tilt, grid)
        tilted = np.exp(log_tilted)
        spectra.append(numpy_fft.fft(tilted, length)[:half])
        forward_errors.append(gamma * float(tilted.sum()) * (1.0 + tilted.size * UNIT_ROUNDOFF))
        counts.append(count)
        log_z_total += count * log_z
        # the exponent lam l - log Z is computed with an absolute error of a few ulps of its size
        exponent_size += count * (float(np.max(np.abs(tilt * grid * pmf.loss_indices))) + abs(log_z) + 1.0)
    product = np.ones(half, dtype=complex)
    for spectrum, count in zip(spectra, counts):
        product *= spectrum**count
    composed = numpy_fft.ifft(np.concatenate([product, np.conj(product[1:length - half + 1][::-1])])).real
    entry_error = power_product_entry_error([np.abs(s) for s in spectra], counts, forward_errors, product, length)
    # position j of the circular result holds loss index lowest + j (mod length)
    indices = first + np.arange(length)
    window = composed[(indices - lowest) % length]
    log_untilt = log_z_total - tilt * grid * indices
    with np.errstate(divide="ignore"):
        log_bound = np.log(np.maximum(window + entry_error, 0.0)) + log_untilt
    log_total_mass = sum(count * math.log(pmf.finite_mass) for pmf, count in steps)
    probs = np.exp(np.minimum(log_bound, log_total_mass))
    top = grid * (indices[-1] + 1)
    above = log_chernoff_tail(steps, grid, top - grid / 2, tilt) if top <= grid * _highest(steps) else -math.inf
    untilt_error = 4.0 * UNIT_ROUNDOFF * (float(np.max(np.abs(log_untilt))) + 1.0)
    single_step_error = composition_relative_error([(pmf.tail_relative_error, count) for pmf, count in steps])
    relative_error = single_step_error + 4.0 * UNIT_ROUNDOFF * exponent_size + untilt_error
    floor = grid * first if first > lowest else -math.inf
    return BoundedPmf(grid * indices, probs, _composed_infinity_mass(steps) + math.exp(above), relative_error, floor)


def _lowest(steps: Steps) -> int:
    """The grid index of the smallest finite composed loss."""
    return sum(count * pmf.lower for pmf, count in steps)


def _highest(steps: Steps) -> int:
    """The grid index of the largest finite composed loss."""
    return sum(count * (pmf.lower + pmf.probs.size - 1) for pmf, count in steps)
