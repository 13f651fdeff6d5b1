"""Bounds on the floating-point error of the FFT composition of PLDs.

The PLD route composes (tilted) privacy loss distributions with FFTs in float64
(:mod:`dpnoise.accounting.pld.tilted`: ``ifft(prod_e fft(p_e, L) ** T_e)``, NumPy's pocketfft).
Pessimistic discretisation keeps the composition an upper bound in exact arithmetic, but the
FFT's round-off is an *absolute* error, of the order of 1e-16 of the total mass per entry of the
composed PMF: summed over the entries above epsilon it can reach the deltas users ask for, and
then epsilon(delta) can come out below the truth.  The functions here bound that error entry by
entry, from the computed spectra themselves (docs/theory/pld_roundoff.md), so that the PLD route
reports an epsilon for the bound, not for the rounded PMF.

Error model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 24.1):
each output of a length-L FFT is a sum of the inputs times products of twiddle factors, computed
in at most ceil(log2 L) butterfly passes; each pass multiplies the componentwise error bound by
at most (1 + c u), so ``|fl(Fx)_k - (Fx)_k| <= ((1 + c u)^levels - 1) * sum_j |x_j|``.  The
textbook constant for radix 2 is c ~ 6 (complex multiply-add with accurate twiddles); pocketfft's
radix 3, 4, 5, 7 and 11 passes cost at most ~5 u per binary level; c = 32 is taken.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: Unit round-off of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Componentwise error growth of one binary level of an FFT (see the module docstring).
FFT_ERROR_PER_LEVEL = 32.0 * UNIT_ROUNDOFF
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


def composition_relative_error(events: Sequence[tuple[float, int]]) -> float:
    """R with true delta(eps) <= (1 + R) x that of the computed single-step PMFs' exact composition, for
    events (rho_e, T_e): each PMF's upper tail sums are >= (1 - rho_e) x the exact ones, an order
    convolution keeps, so the composition dominates prod_e (1 - rho_e)^T_e x the exact one:
    R = prod_e (1 - rho_e)^-T_e - 1."""
    return math.expm1(-sum(count * math.log1p(-rho) for rho, count in events))


def power_product_entry_error(abs_spectra: list[np.ndarray], counts: list[int], forward_errors: list[float],
                              product: np.ndarray, length: int = 0) -> float:
    """Bound on |computed - exact| of every entry of ``ifft(prod_e fft(x_e, L) ** T_e)``.

    For each factor, with |X~_k - X_k| <= e (the forward transform's bound ``forward_errors``) and
    U = |X~_k| + e bounding both spectra: |X~^T - X^T| <= T e U^(T-1) (mean value theorem) plus the
    power's own rounding |X~|^T (exp(c T (|log|X~|| + pi + 1)) - 1 + 4u).  A product of factors
    with errors eps_e and magnitudes at most V_e = U_e^T_e (1 + rounding) errs by at most
    sum_e eps_e prod_{f != e} V_f plus a few ulps of prod V per multiplication.  The inverse FFT
    (normalised by 1/L) adds gamma(L) (1/L) sum_k |Y~_k|; every entry is a mean over k, so its
    error is the mean of the spectrum's bound plus that (docs/theory/pld_roundoff.md).
    Evaluated in log space (powers of T up to 10^8 under- and overflow).

    ``length``: L where the spectra and ``product`` hold the entries k <= L/2 only of spectra of real
    inputs, conjugate-symmetric (X_{L-k} = conj(X_k)): the other entries are the mirror images of
    these, with the same bounds, so they count twice in the mean (:func:`mirror_multiplicity`).
    """
    length = length or product.size
    gamma = fft_error_factor(length)
    errors, magnitudes = [], []
    for spectrum, count, forward_error in zip(abs_spectra, counts, forward_errors):
        log_upper = np.log(spectrum + forward_error)
        with np.errstate(divide="ignore"):
            log_computed = np.log(spectrum)
        exponent_error = _POWER_ERROR_PER_UNIT * count * (np.abs(np.where(spectrum > 0, log_computed, 0.0)) + math.pi + 1)
        rounding = np.expm1(exponent_error) + 4 * UNIT_ROUNDOFF
        propagated = count * forward_error * np.exp((count - 1) * log_upper)
        errors.append(propagated + np.exp(count * log_computed) * rounding)
        magnitudes.append(np.exp(count * log_upper) * (1.0 + rounding))
    all_magnitudes = np.prod(magnitudes, axis=0)
    spectrum_error = 4.0 * UNIT_ROUNDOFF * len(counts) * all_magnitudes
    for index, error in enumerate(errors):
        others = np.prod([m for other, m in enumerate(magnitudes) if other != index], axis=0) if len(counts) > 1 else 1.0
        spectrum_error = spectrum_error + error * others
    inverse_rounding = (gamma + UNIT_ROUNDOFF) * (np.abs(product) + spectrum_error)
    entry_bounds = spectrum_error + inverse_rounding
    mean = float(mirror_multiplicity(entry_bounds.size, length) @ entry_bounds) / length
    # Underflow of the powers to zero or subnormals: at most the smallest normal per term.
    return mean * (1.0 + summation_error_factor(entry_bounds.size)) + np.finfo(float).tiny * length * len(counts)


def mirror_multiplicity(size: int, length: int) -> np.ndarray:
    """How often each of the first ``size`` entries of a conjugate-symmetric length-``length`` spectrum
    occurs in the whole (all once when ``size`` is the length; else entries 0 and, for an even length,
    L/2 once, the others twice)."""
    if size == length:
        return np.ones(size)
    if size != length // 2 + 1:
        raise ValueError(f"{size} entries are neither the whole length-{length} spectrum nor its first half")
    multiplicity = np.full(size, 2.0)
    multiplicity[0] = 1.0
    if length % 2 == 0:
        multiplicity[-1] = 1.0
    return multiplicity
