"""Bounds on the floating-point error of dp_accounting's FFT composition of PLDs.

dp_accounting composes privacy loss distributions with FFTs in float64
(``common.self_convolve``: ``ifft(fft(p, L) ** T)``; ``signal.fftconvolve`` for two different
PMFs).  Pessimistic discretisation and tail truncation keep it an upper bound in exact arithmetic,
but the FFT's round-off is an *absolute* error, of the order of 1e-17 per entry of the composed
PMF: summed over the entries above epsilon it reaches the deltas of 1e-10 and below, and then
epsilon(delta) can come out below the truth (docs/ACCOUNTING.md, "Round-off of the PLD route").
The functions here bound that error entry by entry, from the computed spectrum itself
(docs/theory/pld_roundoff.md), so that the PLD route reports an epsilon for the bound, not for
the rounded PMF.

Error model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 24.1):
each output of a length-L FFT is a sum of the inputs times products of twiddle factors, computed
in at most ceil(log2 L) butterfly passes; each pass multiplies the componentwise error bound by
at most (1 + c u), so ``|fl(Fx)_k - (Fx)_k| <= ((1 + c u)^levels - 1) * sum_j |x_j|``.  The
textbook constant for radix 2 is c ~ 6 (complex multiply-add with accurate twiddles); pocketfft's
radix 3, 4, 5, 7 and 11 passes cost at most ~5 u per binary level; c = 32 is taken.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft as scipy_fft

#: Unit round-off of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Componentwise error growth of one binary level of an FFT (see the module docstring).
FFT_ERROR_PER_LEVEL = 32.0 * UNIT_ROUNDOFF
#: Relative error allowed on each upper tail sum (sum_{i >= j} p_i + infinity mass) of a single-step
#: PMF as dp_accounting computes it: first differences of hockey-stick values at adjacent grid
#: points; within 2e-9 of 40-digit mpmath on grids down to 2e-5 (docs/theory/pld_roundoff.md; single
#: masses, second differences, are far less accurate at negative losses and need not be).
SINGLE_STEP_RELATIVE_ERROR = 1e-7
#: Relative error of complex ``z ** T`` (glibc's cpow is exp(T log z); numpy's binary powering
#: below T = 100): at most this many units per unit of |T log z| + T pi, plus a few ulps.
_POWER_ERROR_PER_UNIT = 8.0 * UNIT_ROUNDOFF


def fft_error_factor(length: int) -> float:
    """gamma(L): an FFT of length L has componentwise error <= gamma(L) * sum_j |x_j|."""
    levels = math.ceil(math.log2(max(length, 2)))
    return math.expm1(levels * math.log1p(FFT_ERROR_PER_LEVEL))


def summation_error_factor(count: int) -> float:
    """Relative error bound of a sum of ``count`` nonnegative float64 terms in any order (a BLAS dot
    product is blocked, not pairwise): gamma_n = n u / (1 - n u) (Higham, Sec. 3.1), with the
    rounding of each term's weight (a few ulps) included."""
    terms = max(count, 2) * UNIT_ROUNDOFF
    return terms / (1.0 - terms) + 4.0 * UNIT_ROUNDOFF


def self_convolution_length(probs: np.ndarray, count: int, tail_mass_truncation: float) -> int:
    """The FFT length dp_accounting's ``common.self_convolve`` uses for ``count`` compositions."""
    from dp_accounting.pld import common  # noqa: PLC0415 (slow import)

    lower, upper = common.compute_self_convolve_bounds(probs, count, tail_mass_truncation)
    return int(scipy_fft.next_fast_len(max(upper - lower + 1, len(probs))))


def self_convolution_entry_error(probs: np.ndarray, count: int, length: int) -> float:
    """Bound on |computed - exact| of every entry of ``ifft(fft(probs, L) ** count)``.

    With X = FFT(p) computed as X~ (|X~_k - X_k| <= e = gamma(L) ||p||_1) and Y = X^T:
    |X~^T - X^T| <= T e (|X~| + e)^(T-1) (mean value theorem), the power's own rounding
    |X~|^T (exp(c T (|log|X~|| + pi + 1)) - 1), and the inverse FFT (normalised by 1/L) adds
    gamma(L) (1/L) sum_k |Y~_k|.  Every entry's error is at most (1/L) sum_k of the first two
    plus the third.  Evaluated in log space (|X~|^T under- or overflows).
    """
    if count == 1:
        return 0.0
    probs = np.asarray(probs, dtype=float)
    gamma = fft_error_factor(length)
    forward_error = gamma * float(np.abs(probs).sum())
    spectrum = np.abs(scipy_fft.fft(probs, length))
    with np.errstate(divide="ignore"):
        log_upper = np.log(spectrum + forward_error)
        log_computed = np.log(spectrum)
    propagated = count * forward_error * np.exp((count - 1) * log_upper)
    exponent_error = _POWER_ERROR_PER_UNIT * count * (np.abs(np.where(spectrum > 0, log_computed, 0.0)) + math.pi + 1)
    powered = np.exp(count * log_computed)
    power_rounding = powered * (np.expm1(exponent_error) + 4 * UNIT_ROUNDOFF)
    inverse_rounding = (gamma + UNIT_ROUNDOFF) * (powered + power_rounding)
    total = float(np.mean(propagated + power_rounding + inverse_rounding))
    # Underflow of |X~|^T to zero or subnormals: at most the smallest normal per term.
    return total + np.finfo(float).tiny * length


def convolution_entry_error(error_a: float, probs_a: np.ndarray, error_b: float, probs_b: np.ndarray) -> float:
    """Bound on every entry's error of ``fftconvolve(a, b)`` when a and b carry entrywise errors.

    The exact convolution of two vectors with entrywise errors e_a, e_b differs from that of
    the exact vectors by at most e_a ||b||_1 + e_b ||a||_1 + e_a e_b min(len); the FFT product
    adds gamma(L) ||a||_1 ||b||_1 per transform (two forward, one inverse).
    """
    mass_a = float(np.abs(probs_a).sum()) + error_a * len(probs_a)
    mass_b = float(np.abs(probs_b).sum()) + error_b * len(probs_b)
    gamma = fft_error_factor(len(probs_a) + len(probs_b))
    return (error_a * mass_b + error_b * mass_a + error_a * error_b * min(len(probs_a), len(probs_b))
            + 4.0 * gamma * mass_a * mass_b)


def composition_relative_error(compositions: int) -> float:
    """R with true delta(eps) <= (1 + R) x that of the computed single-step PMFs' exact composition:
    their upper tail sums are >= (1 - rho) x the exact ones, an order convolution keeps, so the
    T-fold composition dominates (1 - rho)^T x the exact one: R = (1 - rho)^-T - 1."""
    return math.expm1(-compositions * math.log1p(-SINGLE_STEP_RELATIVE_ERROR))
