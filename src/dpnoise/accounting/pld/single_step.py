"""Single-step PLDs of the Poisson-sampled Gaussian and Laplace mechanisms, built here with a proven error.

Add/remove adjacency in dp_accounting's convention, sensitivity 1, noise M = N(0, sigma^2) or Lap(b):
remove compares P_q = (1 - q) M + q M(. + 1) with M, add compares M with P_q.  The unsampled pair
P_0 = M(. + 1) vs Q_0 = M has the hockey-stick curve delta_0(l) = E_Q0[(e^L - e^l)_+] with L its
privacy loss.  With w(t) = e^t - (1 - q) and l(t) = log(w(t) / q) (the inverse of the sampling map
t = log(1 - q + q e^l)), every curve the discretisation needs follows from delta_0:

    remove, upper:  delta_r(t) = q delta_0(l(t))             (w > 0; else 1 - e^t)
    remove, lower:  g_r(t) = E_Q[(e^t - e^L)_+] = w(t) delta_0(-l(t))   (w > 0; else 0)
    add:            delta_a(t) = e^t g_r(-t),  g_a(t) = e^t delta_r(-t)

(delta_0 of the symmetric pair satisfies g_0(l) = e^l delta_0(-l), and H_{e^t}(P||Q) = 1 - e^t +
e^t H_{e^-t}(Q||P)).  Each value comes with a bound on its absolute error: the special functions'
errors (checked against 40-digit mpmath), the roundings of every operation, the rounding of the grid
point, each propagated through the curve's slope (first order, doubled).

Pessimistic connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, arXiv 2207.04380,
Algorithm 1) on the grid l_j = j h puts masses on l_lo..l_top and delta(l_top) at +inf; its upper tail
sums are S_lo = 1 and, for j > lo (docs/theory/pld_roundoff.md, "The single-step PMFs"),

    S_j = (delta_{j-1} - e^{-h} delta_j) / (1 - e^{-h})   =   1 - (e^{-h} g_j - g_{j-1}) / (1 - e^{-h}).

Both numerators are differences of nonnegative terms whose exact value is at least (1 - e^{-h}) times
the larger one, so their relative error is at most ~(error of the values) / h; each tail sum takes the
form with the smaller proven bound.  Masses are p_j = S_j - S_{j+1}, negatives raised to 0 (which only
raises tails).  The PMF's ``tail_relative_error`` rho is the largest proven relative error of a tail
sum; where a tail sum's relative bound exceeds ``_RELATIVE_ERROR_CAP`` (tails far smaller than their
neighbours' errors, e.g. next to an atom of the Laplace loss) it is raised by its absolute bound
instead, which needs no rho.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import erfcx, log_ndtr, ndtr

from dpnoise.accounting.pld.roundoff import UNIT_ROUNDOFF as U
from dpnoise.accounting.pld.tilted import GridPmf

#: Relative error of scipy's ndtr(t) and erfcx(-t / sqrt 2) (argument rounding included), per (1 + t^2):
#: 4 times the largest found against 40-digit mpmath for |t| <= 37 (10.2 u for erfcx, 3.4 u for ndtr).
SPECIAL_FUNCTION_ERROR = 40.0 * U
#: Relative error of erfcx(y) for y >= 0 and absolute error of log_ndtr(t) for t > 0: 4 times the largest
#: found against 40-digit mpmath (10.2 u and 1 u).
MILLS_ERROR = 40.0 * U
#: The Gaussian's x-range is truncated at 10 standard deviations (tail mass Phi(-10) < e^-53 on each
#: side), as dp_accounting's default truncation (e^-50): the losses of |x| <= 10 sigma (+ 1).
GAUSSIAN_TAIL = 10.0
#: Tail sums whose proven relative error exceeds this are raised by their absolute error bound instead.
_RELATIVE_ERROR_CAP = 1e-9
_LOG_HALF_PI = 0.5 * math.log(0.5 * math.pi)
_LOG_SQRT_TWO_PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class UnsampledPair:
    """The symmetric pair P_0 = M(. + 1) vs Q_0 = M of an additive noise M (sensitivity 1).

    ``hockey_stick(l)``: (delta_0(l), a bound on its absolute error) at float losses l;
    ``upper_tail(l)`` / ``lower_tail(l)``: upper bounds on Q_0(L > l) and Q_0(L <= l), the slopes
    e^-l |d delta_0 / dl| and e^-l dg_0/dl that propagate an error in l;
    ``max_loss``: the largest loss kept (the loss range is [-max_loss, max_loss]);
    ``loss_bounded``: the loss never exceeds ``max_loss`` (no tail was cut), so delta_0 is exactly 0 above it.
    """

    hockey_stick: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    upper_tail: Callable[[np.ndarray], np.ndarray]
    lower_tail: Callable[[np.ndarray], np.ndarray]
    max_loss: float
    loss_bounded: bool = False


def _log_mills(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log M(t), abs error bound), M(t) = Phi(t) / phi(t) the Mills ratio of the lower tail.

    M(t) = sqrt(pi/2) erfcx(-t / sqrt 2) for t <= 0; log Phi(t) + t^2/2 + log sqrt(2 pi) for t > 0
    (erfcx of a large negative argument overflows; there log_ndtr is accurate to a few ulps).
    """
    t = np.asarray(t, dtype=float)
    with np.errstate(over="ignore", divide="ignore"):
        negative = np.log(erfcx(-np.minimum(t, 0.0) / math.sqrt(2.0))) + _LOG_HALF_PI
        positive = log_ndtr(np.maximum(t, 0.0)) + 0.5 * t * t + _LOG_SQRT_TWO_PI
    value = np.where(t <= 0.0, negative, positive)
    # erfcx of a nonnegative argument and log_ndtr of a positive one are accurate to a few ulps (the
    # t^2 growth of SPECIAL_FUNCTION_ERROR is that of erfcx(-x) ~ e^{x^2} and of ndtr(t < 0)); the log
    # and t^2 / 2 round by a few ulps of the value.
    return value, MILLS_ERROR + 4.0 * U * (np.abs(value) + 1.0)


def gaussian_pair(sigma: float) -> UnsampledPair:
    """N(-1, sigma^2) vs N(0, sigma^2): delta_0(l) = Phi(a) - e^l Phi(b), a = 1/(2 sigma) - l sigma,
    b = a - 1/sigma (Balle & Wang, arXiv 1805.06530, Thm. 8).

    Evaluated as Phi(a) (1 - r) with r = e^l Phi(b) / Phi(a) = M(b) / M(a) (the densities balance,
    e^l phi(b) = phi(a)), log r = log M(b) - log M(a) and 1 - r = -expm1(log r): no subtraction of
    close values but that of the log Mills ratios, whose error is bounded.  The error bound adds the
    effect of the roundings of a and b: d/da + d/db of Phi(a) - phi(a) M(b) is (a - b) Phi(a) r, and
    |d/da| <= phi(a) / (1 + min(b, 0)^2) + (|a| + mu) Phi(a) r (1 - |b| M(|b|)-style Mills bound for
    b < 0: 1 + b M(b) < 1 / (1 + b^2)); b = a - mu keeps a - b exact to the rounding of one subtraction.
    """
    mu = 1.0 / sigma

    def hockey_stick(loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = 0.5 * mu - loss * sigma
        b = a - mu
        log_m_a, error_a = _log_mills(a)
        log_m_b, error_b = _log_mills(b)
        log_r = np.minimum(log_m_b - log_m_a, 0.0)
        eta = error_a + error_b + U * np.abs(log_r)
        r = np.exp(log_r)
        one_minus_r = -np.expm1(log_r)
        phi_a_cdf = ndtr(a)
        delta = phi_a_cdf * one_minus_r
        with np.errstate(over="ignore"):  # an infinite bound is a valid (useless) bound: that tail is raised to it
            one_minus_r_error = 2.0 * U * one_minus_r + r * np.expm1(eta) * (1.0 + 2.0 * U)
        cdf_error = SPECIAL_FUNCTION_ERROR * (1.0 + a * a)
        density = np.exp(-0.5 * a * a - _LOG_SQRT_TWO_PI)
        shift_a = 2.0 * U * (np.abs(a) + 2.0 * np.abs(loss * sigma) + mu)  # a's rounding (mu's included)
        shift_difference = U * (np.abs(b) + 2.0 * mu)  # (a - b) - 1/sigma
        common = mu * phi_a_cdf * r * shift_a
        differential = (density / (1.0 + np.minimum(b, 0.0) ** 2) + (np.abs(a) + mu) * phi_a_cdf * r) * shift_difference
        error = (delta * (cdf_error + 4.0 * U) + phi_a_cdf * (1.0 + cdf_error) * one_minus_r_error
                 + 2.0 * (common + differential))
        return delta, error

    def upper_tail(loss: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, 2.0 * ndtr(-0.5 * mu - loss * sigma))

    def lower_tail(loss: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, 2.0 * ndtr(0.5 * mu + loss * sigma))

    return UnsampledPair(hockey_stick, upper_tail, lower_tail, GAUSSIAN_TAIL * mu + 0.5 * mu * mu)


def laplace_pair(scale: float) -> UnsampledPair:
    """Lap(-1, b) vs Lap(0, b): the loss lies in [-1/b, 1/b] and delta_0(l) = 1 - e^{(l - 1/b)/2} for
    |l| < 1/b, 1 - e^l below, 0 above (e.g. Koskela et al., arXiv 2006.07134).  Computed by expm1
    (a few ulps) with the rounding of its argument."""
    top = 1.0 / scale

    def hockey_stick(loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        half = 0.5 * (loss - top)
        delta = np.where(loss < -top, -np.expm1(loss), np.where(loss < top, -np.expm1(half), 0.0))
        slope = np.exp(np.minimum(half, 0.0))  # bounds |d delta_0 / dl| on every branch
        return delta, 4.0 * U * delta + 2.0 * U * slope * (np.abs(loss) + 2.0 * top)

    def upper_tail(loss: np.ndarray) -> np.ndarray:
        return np.minimum(1.0, np.exp(-0.5 * (loss + top)))

    def lower_tail(loss: np.ndarray) -> np.ndarray:
        return np.where(loss >= -top * (1.0 + 8.0 * U), 1.0, 0.0)

    return UnsampledPair(hockey_stick, upper_tail, lower_tail, top, loss_bounded=True)


@dataclass(frozen=True)
class _Inverse:
    """The inverse sampling map at remove-direction losses t, with error bounds (grid-point rounding included)."""

    positive: np.ndarray  # w(t) > 0 (as computed)
    scaled_w: np.ndarray  # e^-t w(t) = 1 - (1 - q) e^-t (0 where w <= 0)
    scaled_w_error: np.ndarray  # bound on the error of e^-t w(t) that l(t) was computed from
    loss: np.ndarray  # l(t) = log(w / q)
    loss_error: np.ndarray  # bound on |computed l - l(t)| (inf where w may be 0)


def _inverse_sampling(points: np.ndarray, q: float) -> _Inverse:
    """w(t) = e^t - (1 - q) and l(t) = log(w / q), without cancellation where e^t > 2 (1 - q)
    (log1p of -(1 - q) e^-t); elsewhere from expm1(t) + q, whose absolute error ~u becomes a large
    relative error only where w is tiny, and there the curves depend on w with slope at most 1."""
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf
    log_q = math.log(q)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = np.exp(log_keep - points)
        far = z <= 0.5
        log_scaled_far = np.log1p(-np.minimum(z, 0.5))
        # z's relative error (log1p(-q), the subtraction, exp, the grid point) times z / (1 - z) <= 2 z
        keep_size = abs(log_keep) if q < 1.0 else 0.0
        error_far = U * (3.0 * np.abs(points) + 3.0) + 2.0 * z * U * (4.0 + 2.0 * keep_size + 2.0 * np.abs(points))
        w_near = np.expm1(points) + q
        w_near_safe = np.where(w_near > 0.0, w_near, 1.0)
        w_error = U * (2.0 * np.abs(np.expm1(points)) + np.abs(w_near) + 2.0 * np.abs(points) * np.exp(points))
        error_near = -np.log1p(-np.minimum(w_error / w_near_safe, 1.0)) + U
        positive = far | (w_near > 0.0)
        log_scaled = np.where(far, log_scaled_far, np.log(w_near_safe) - points)
        loss = points + log_scaled - log_q
        rounding = U * (np.abs(points) + np.abs(log_scaled) + abs(log_q) + np.abs(loss))
        loss_error = np.where(far, error_far, error_near) + rounding
        scaled_w = np.where(positive, np.exp(log_scaled), 0.0)
        scaled_w_error = np.where(far, scaled_w * np.expm1(loss_error),
                                  np.exp(-points) * (w_error + np.abs(w_near) * np.expm1(rounding + U)))
    return _Inverse(positive, scaled_w, scaled_w_error, np.where(positive, loss, 0.0), loss_error)


def _times(log_factor: np.ndarray, values: np.ndarray) -> np.ndarray:
    """e^log_factor x values >= 0, in log space (the factor alone may overflow where the product does not)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return np.where(values > 0.0, np.exp(log_factor + np.log(np.where(values > 0.0, values, 1.0))), 0.0)


def _sampled_curves(points: np.ndarray, q: float, pair: UnsampledPair) -> tuple[np.ndarray, ...]:
    """(delta_r, its error, g_r / e^t, its error / e^t) at remove-direction losses ``points``.

    The lower curve is returned divided by e^t (= e^-t w(t) delta_0(-l)), so that the add direction's
    delta_a(t) = e^t g_r(-t) needs no factor e^t that could overflow.  An error dw in w moves delta_r by at
    most dw Q_0(L > l') and g_r by at most dw Q_0(L <= l'') for l', l'' within the error of l
    (d delta_r / dw = -Q_0(L > l), dg_r / dw = Q_0(L <= l)); where w <= 0 the curves are 1 - e^t and 0,
    exactly where w truly is <= 0 and within dw (>= q g_0(l) = w) where it was rounded across 0.
    """
    inverse = _inverse_sampling(points, q)
    loss, loss_error = inverse.loss, inverse.loss_error
    upper, upper_error = pair.hockey_stick(loss)
    mirror, mirror_error = pair.hockey_stick(-loss)
    with np.errstate(invalid="ignore"):
        upper_slope = pair.upper_tail(loss - loss_error)
        lower_slope = pair.lower_tail(loss + loss_error)
    dw = inverse.scaled_w_error
    # where w <= 0, t <= log(1 - q) < 0: the clamp only keeps the unused entries from overflowing
    delta = np.where(inverse.positive, q * upper, -np.expm1(np.minimum(points, 0.0)))
    delta_error = (np.where(inverse.positive, q * upper_error + _times(points, dw * upper_slope), _times(points, dw))
                   + 2.0 * U * delta)
    lower = inverse.scaled_w * mirror
    lower_error = np.where(inverse.positive, inverse.scaled_w * mirror_error + dw * lower_slope, dw) + 3.0 * U * lower
    return delta, delta_error, lower, lower_error


def _tail_sums(upper: np.ndarray, upper_error: np.ndarray, lower: np.ndarray, lower_error: np.ndarray,
               grid: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S_j, proven relative and absolute error bounds of each) for j > lo, from delta_j (upper) and g_j (lower) at l_lo..l_top.

    Upper form (delta_{j-1} - e^-h delta_j) / (1 - e^-h) and lower form 1 - (e^-h g_j - g_{j-1}) / (1 - e^-h)
    (arXiv 2207.04380, Algorithm 1, summed from the top and from the bottom); each numerator's error is at
    most its terms' errors plus a few ulps of its terms, relative to the numerator's lower bound.
    """
    decay, width = math.exp(-grid), -math.expm1(-grid)
    numerator = upper[:-1] - decay * upper[1:]
    numerator_error = upper_error[:-1] + upper_error[1:] + 4.0 * U * (upper[:-1] + upper[1:])
    # an error bound that overflows only rules its form out (inf is never the smaller)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        from_top = numerator / width
        top_error = np.where(numerator > numerator_error, numerator_error / (numerator - numerator_error), np.inf) + 4.0 * U
        top_absolute = numerator_error / width * (1.0 + 4.0 * U) + 4.0 * U * np.abs(from_top)
        lower_part = (decay * lower[1:] - lower[:-1]) / width
        lower_part_error = (lower_error[1:] + lower_error[:-1] + 4.0 * U * (lower[1:] + lower[:-1])) / width * (1.0 + 4.0 * U)
        from_bottom = 1.0 - lower_part
        absolute = lower_part_error + 2.0 * U
        bottom_error = np.where(from_bottom > absolute, absolute / (from_bottom - absolute), np.inf)
    use_bottom = bottom_error < top_error
    return (np.where(use_bottom, from_bottom, from_top), np.where(use_bottom, bottom_error, top_error),
            np.where(use_bottom, absolute, top_absolute))


def connect_the_dots(lowest: int, grid: float, upper: np.ndarray, upper_error: np.ndarray, lower: np.ndarray,
                     lower_error: np.ndarray, loss_bounded: bool = False) -> GridPmf:
    """The pessimistic connect-the-dots PMF (arXiv 2207.04380, Algorithm 1) on l_lowest..l_top from the
    hockey-stick values delta_j (``upper``) and g_j = delta_j - (1 - e^{l_j}) (``lower``) with their error
    bounds: all mass below l_lowest on it (S_lowest = 1), delta_top (raised by its error) at +inf, or none
    where ``loss_bounded``: l_top is at or above the supremum of the loss, where delta is exactly 0."""
    tails, relative, absolute = _tail_sums(upper, upper_error, lower, lower_error, grid)
    poor = relative > _RELATIVE_ERROR_CAP
    tails = np.concatenate([[1.0], np.where(poor, tails + absolute, tails)])
    infinity_mass = 0.0 if loss_bounded else float(upper[-1] + upper_error[-1])
    probs = np.maximum(np.diff(-np.concatenate([tails, [infinity_mass]])), 0.0)
    # Differences of floats within a factor 2 are exact (Sterbenz); others round by u: 2u covers the sums.
    rho = float(np.max(relative[~poor], initial=0.0)) + 2.0 * U
    return GridPmf(lowest, probs, infinity_mass, rho)


def _sampled_range(q: float, max_loss: float) -> tuple[float, float]:
    """(lowest, highest) remove-direction loss: log(1 - q + q e^{-+max_loss})."""
    if q >= 1.0:
        return -max_loss, max_loss
    keep, log_q = math.log1p(-q), math.log(q)
    return float(np.logaddexp(keep, log_q - max_loss)), float(np.logaddexp(keep, log_q + max_loss))


def sampled_pmfs(pair: UnsampledPair, q: float, grid: float) -> tuple[GridPmf, GridPmf]:
    """(remove, add) pessimistic connect-the-dots PMFs of one Poisson-sampled step on the grid j ``grid``."""
    low, high = _sampled_range(q, pair.max_loss)
    # Where a direction's loss has a supremum (the add direction's -log(1 - q) at q < 1; both directions'
    # for a pair whose loss is bounded, e.g. the Laplace), its delta is exactly 0 from there on: the grid
    # reaches one point past the (rounded) supremum and holds no infinity mass, since the computed delta
    # there is 0 plus its rounding bound, which T steps would turn into T times an artificial mass.
    remove_bounded, add_bounded = pair.loss_bounded, q < 1 or pair.loss_bounded
    remove_lo, remove_top = math.floor(low / grid), math.ceil(high / grid) + remove_bounded
    add_lo = math.floor(-high / grid)
    add_top = (math.ceil(-math.log1p(-q) / grid) if q < 1 else math.ceil(-low / grid)) + add_bounded
    remove = sampled_curves_on_grid(pair, q, grid, remove_lo, remove_top, "remove")
    add = sampled_curves_on_grid(pair, q, grid, add_lo, add_top, "add")
    return (connect_the_dots(remove_lo, grid, *remove, loss_bounded=remove_bounded),
            connect_the_dots(add_lo, grid, *add, loss_bounded=add_bounded))


def sampled_curves_on_grid(pair: UnsampledPair, q: float, grid: float, lowest: int, top: int,
                           direction: str) -> tuple[np.ndarray, ...]:
    """(delta, error, g, error) of ``direction`` at the grid points l_lowest..l_top.

    Add: delta_a(t) = e^t g_r(-t) and g_a(t) = e^t delta_r(-t) (H_{e^t}(P||Q) = 1 - e^t + e^t H_{e^-t}(Q||P)).
    """
    points = grid * np.arange(lowest, top + 1, dtype=float)
    if direction == "remove":
        delta, delta_error, scaled_lower, scaled_lower_error = _sampled_curves(points, q, pair)
        return delta, delta_error, _times(points, scaled_lower), _times(points, scaled_lower_error)
    mirror_delta, mirror_error, scaled_lower, scaled_lower_error = _sampled_curves(-points, q, pair)
    lower = _times(points, mirror_delta)
    return scaled_lower, scaled_lower_error + 2.0 * U * scaled_lower, lower, _times(points, mirror_error) + 2.0 * U * lower


def gaussian_pmfs(noise_multiplier: float, q: float, grid: float) -> tuple[GridPmf, GridPmf]:
    """(remove, add) PMFs of the Poisson-sampled Gaussian mechanism of noise multiplier ``noise_multiplier``."""
    return sampled_pmfs(gaussian_pair(noise_multiplier), q, grid)


def laplace_pmfs(scale: float, q: float, grid: float) -> tuple[GridPmf, GridPmf]:
    """(remove, add) PMFs of the Poisson-sampled Laplace mechanism of scale ``scale`` (sensitivity 1)."""
    return sampled_pmfs(laplace_pair(scale), q, grid)
