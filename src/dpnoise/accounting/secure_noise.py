"""Floating-point-safe noise on a grid: its integer parameters and what the accountants are told.

The secure samplers (``dpnoise.mechanisms.secure_noise``) release ``grid * (round(S / grid) + Z)``
with ``S`` the sum of clipped gradients, ``grid`` a power of two and ``Z`` an integer vector drawn
exactly from random bits (docs/theory/secure_noise.md):

* Laplace (``lap2``, ``laplace-l1``): ``Z_i = floor(L_i)`` with ``L_i ~ Lap(0, t)`` continuous, so the
  release is the continuous Laplace mechanism of scale ``t * grid`` floored onto the grid (§2);
* Gaussian: ``Z_i`` discrete Gaussian of variance ``t * w`` (Canonne, Kamath & Steinke,
  arXiv 2004.00010), within a factor ``exp(+-kappa)`` of the continuous Gaussian of variance
  ``t * w - SMOOTHING**2`` put through a fixed randomized rounding (§3).

Rounding ``S`` onto the grid moves a neighbouring difference by at most ``grid`` per coordinate, so
the sensitivity grows from C to ``C' = C + grid * r`` with ``r = ceil(sqrt(n))`` (L2) or ``n`` (L1)
(§1).  The integer parameters are chosen so that the noise is at least the requested one at the
INFLATED sensitivity: ``t * grid >= b C'/C`` (Laplace), ``t * w - SMOOTHING**2 >= (sigma C'/grid)^2``
(Gaussian).  Hence the default accountants, given the requested noise and clip unchanged, bound the
released values: exactly for Laplace; for the Gaussian after a correction (below 1e-100 for any
practical run) that every accountant applies once over its ledger, whose secure steps are
:class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent` s (:func:`discrete_log_ratio`,
:func:`released_epsilon`, :func:`released_delta`).

Pure Python (exact rationals for the integer parameters): no torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional

from dpnoise.accounting.events import ComposedEvent, DiscreteGaussianStepEvent, DpEvent, SelfComposedEvent
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_count,
    check_delta,
    check_positive,
)

__all__ = [
    "GRID_SLACK",
    "SMOOTHING",
    "GridRounding",
    "DiscreteLaplacePlan",
    "DiscreteGaussianPlan",
    "rounding_grid",
    "grid_rounding",
    "plan_discrete_laplace",
    "plan_discrete_gaussian",
    "smoothing_log_ratio",
    "discrete_log_ratio",
    "continuous_event",
    "released_epsilon",
    "released_delta",
    "discrete_gaussian_epsilon",
    "discrete_gaussian_budget",
]

#: default bound on the sensitivity's relative growth from rounding onto the grid: C' <= C (1 + 2^-10)
GRID_SLACK = 2.0 ** -10
#: width tau (in grid steps) of the randomized rounding that relates the discrete Gaussian to the
#: continuous one (docs/theory/secure_noise.md §3): kappa <= 4.01 exp(-2 pi^2 tau^2) = 2.8e-137 per
#: coordinate and step
SMOOTHING = 4
#: largest Laplace parameter t (grid steps): keeps t * V in int64 for every V the sampler can reach
MAX_LAPLACE_STEPS = 2 ** 40
#: the discrete Gaussian variance t * w (grid steps squared) stays below this: 2 t w < 2^55 keeps the
#: exact Bernoulli comparisons in int64 (the sampler's digit recurrence multiplies remainders by 256)
MAX_GAUSSIAN_VARIANCE = 2 ** 54


def _rounding_terms(coordinates: int, norm_ord: int) -> int:
    """r with ||rounding difference|| <= grid * r: ceil(sqrt(n)) in L2, n in L1."""
    if norm_ord == 2:
        root = math.isqrt(coordinates)
        return root if root * root == coordinates else root + 1
    if norm_ord == 1:
        return coordinates
    raise InvalidParameterError(f"norm_ord must be 1 or 2, got {norm_ord!r}")


def _float_at_least(value: Fraction) -> float:
    """The smallest float >= ``value`` (float() rounds to nearest, which may be below)."""
    result = float(value)
    return result if Fraction(result) >= value else math.nextafter(result, math.inf)


def _power_of_two_at_most(value: Fraction) -> float:
    """The largest power of two <= ``value`` (> 0)."""
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    while Fraction(2) ** exponent > value:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= value:
        exponent += 1
    return math.ldexp(1.0, exponent)


def _power_of_two_at_least(value: Fraction) -> float:
    """The smallest power of two >= ``value`` (> 0)."""
    below = Fraction(_power_of_two_at_most(value))
    return float(below) if below == value else float(2 * below)


def _check_grid(grid: float) -> float:
    grid = check_positive("grid", grid)
    mantissa, _ = math.frexp(grid)
    if mantissa != 0.5:
        raise InvalidParameterError(f"grid must be a power of two (S / grid must be exact), got {grid!r}")
    return grid


def rounding_grid(clip: float, coordinates: int, norm_ord: int, slack: float = GRID_SLACK) -> float:
    """The largest power of two gamma with gamma * r <= slack * clip (r of :class:`GridRounding`):
    the coarsest grid whose rounding raises the sensitivity by at most the fraction ``slack``."""
    clip = check_positive("clip", clip)
    slack = check_positive("slack", slack)
    terms = _rounding_terms(check_count("coordinates", coordinates, 1), norm_ord)
    return _power_of_two_at_most(Fraction(slack) * Fraction(clip) / terms)


@dataclass(frozen=True)
class GridRounding:
    """Rounding the clipped sum onto ``grid`` Z^n (docs/theory/secure_noise.md §1).

    Between neighbouring datasets ||S - S'|| <= clip (L2 or L1, ``norm_ord``), and every coordinate
    of round(S/grid) - S/grid lies in [-1/2, 1/2]; so ||grid (round(S/grid) - round(S'/grid))|| <=
    clip + grid * r with r = ceil(sqrt(n)) (L2) or n (L1): :attr:`inflated_clip`.
    """

    grid: float
    clip: float
    coordinates: int
    norm_ord: int

    @property
    def exact_inflated_clip(self) -> Fraction:
        return Fraction(self.clip) + Fraction(self.grid) * _rounding_terms(self.coordinates, self.norm_ord)

    @property
    def inflated_clip(self) -> float:
        """C' = clip + grid * r, rounded up to a float."""
        return _float_at_least(self.exact_inflated_clip)

    @property
    def inflation(self) -> float:
        """C'/C rounded up: the factor by which the noise is raised so that the accounting is unchanged."""
        return _float_at_least(self.exact_inflated_clip / Fraction(self.clip))


def grid_rounding(clip: float, coordinates: int, norm_ord: int, grid: Optional[float] = None,
                  slack: float = GRID_SLACK) -> GridRounding:
    """The rounding onto ``grid`` (default: :func:`rounding_grid` at ``slack``), checked."""
    clip = check_positive("clip", clip)
    coordinates = check_count("coordinates", coordinates, 1)
    _rounding_terms(coordinates, norm_ord)
    grid = rounding_grid(clip, coordinates, norm_ord, slack) if grid is None else _check_grid(grid)
    return GridRounding(grid, clip, coordinates, norm_ord)


@dataclass(frozen=True)
class DiscreteLaplacePlan:
    """Laplace on the grid: Z_i = floor(L_i), L_i ~ Lap(0, :attr:`steps`) continuous (in grid units).

    The release grid (round(S/grid) + Z) = grid floor((grid round(S/grid) + grid L)/grid) is a
    function of the continuous Laplace mechanism with scale ``steps * grid >= b C'/C`` applied to
    the rounded sum, whose sensitivity is at most C' (docs/theory/secure_noise.md §2): any sound
    Laplace accountant at (b, C) bounds it.
    """

    rounding: GridRounding
    #: t: the scale of the Laplace law in grid steps; the geometric parameter is exp(-1/t)
    steps: int

    @property
    def noise_scale(self) -> float:
        """The Laplace scale actually used, t * grid (exact: t < 2^53 and grid a power of two)."""
        return self.steps * self.rounding.grid


@dataclass(frozen=True)
class DiscreteGaussianPlan:
    """Discrete Gaussian on the grid: Z_i ~ N_Z(0, :attr:`steps` * :attr:`width`) (grid units).

    CKS Algorithm 3 with t = :attr:`steps` and sigma^2 / t = :attr:`width` an integer. Its pmf is
    within exp(+-kappa) of the continuous Gaussian of variance t w - SMOOTHING^2 >= (sigma C'/grid)^2
    randomized-rounded onto the grid (docs/theory/secure_noise.md §3).
    """

    rounding: GridRounding
    steps: int
    width: int
    smoothing: int = SMOOTHING

    @property
    def variance(self) -> int:
        """t * w: the discrete Gaussian's parameter sigma^2, in grid steps squared."""
        return self.steps * self.width

    @property
    def noise_std(self) -> float:
        """grid * sqrt(t w): the standard deviation's parameter in the gradient's units."""
        return math.sqrt(self.variance) * self.rounding.grid


def _coarse_enough(rounding: GridRounding, explicit: bool, needed: Fraction, what: str) -> GridRounding:
    """``rounding`` if its grid >= ``needed``; else the coarser power-of-two grid (or an error when
    the grid was given)."""
    if Fraction(rounding.grid) >= needed:
        return rounding
    if explicit:
        raise InvalidParameterError(
            f"grid {rounding.grid!r} is too fine for the {what}: it must be at least {float(needed):.6g}")
    return GridRounding(_power_of_two_at_least(needed), rounding.clip, rounding.coordinates, rounding.norm_ord)


def plan_discrete_laplace(scale: float, clip: float, coordinates: int, norm_ord: int,
                          grid: Optional[float] = None, slack: float = GRID_SLACK) -> DiscreteLaplacePlan:
    """The grid and t = ceil(b C'/(C grid)) of the secure Laplace sampler (b = ``scale``, absolute).

    ``coordinates`` is n, the number of noised coordinates of the WHOLE gradient (the rounding
    bound is over all of them).  A default grid too fine for t <= 2^40 is coarsened (the inflation
    then exceeds ``slack``; it is still what the plan accounts for).
    """
    scale = check_positive("scale", scale)
    rounding = grid_rounding(clip, coordinates, norm_ord, grid, slack)
    # t <= 2^40 needs grid >= b C'/(C 2^40); C' <= 2 C at any grid below C / r, so b/2^39 suffices
    rounding = _coarse_enough(rounding, grid is not None, Fraction(scale) / 2 ** 39, f"Laplace scale {scale!r}")
    steps = math.ceil(Fraction(scale) * rounding.exact_inflated_clip / (Fraction(rounding.clip)
                                                                         * Fraction(rounding.grid)))
    if steps > MAX_LAPLACE_STEPS:
        raise InvalidParameterError(f"grid {rounding.grid!r} is too fine for the Laplace scale {scale!r} "
                                    f"(t = {steps} grid steps, at most 2^40)")
    return DiscreteLaplacePlan(rounding, steps)


def _ceil_sqrt(value: Fraction) -> int:
    """The smallest integer t >= 1 with t^2 >= value."""
    root = math.isqrt(math.ceil(value))
    return max(1, root if root * root >= value else root + 1)


def plan_discrete_gaussian(noise_multiplier: float, clip: float, coordinates: int,
                           grid: Optional[float] = None, slack: float = GRID_SLACK) -> DiscreteGaussianPlan:
    """The grid and the integers (t, w) of the secure Gaussian sampler (L2 clipping).

    target = (sigma C'/grid)^2 + SMOOTHING^2; t = ceil(sqrt(target)) (CKS's t ~ sigma, which keeps
    the rejection rate low); w = ceil(target / t), so t w >= target.  A default grid too fine for
    t w < 2^54 is coarsened.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    rounding = grid_rounding(clip, coordinates, 2, grid, slack)
    # (sigma C'/grid)^2 + 16 <= 2^54 - 2^28 (t w exceeds the target by < t): grid >= sigma C' / 2^26.9;
    # C' <= 2 C at any grid below C / r, so grid >= sigma C / 2^25 suffices
    rounding = _coarse_enough(rounding, grid is not None, Fraction(sigma) * Fraction(rounding.clip) / 2 ** 25,
                              f"noise multiplier {sigma!r}")
    target = (Fraction(sigma) * rounding.exact_inflated_clip / Fraction(rounding.grid)) ** 2 + SMOOTHING ** 2
    steps = _ceil_sqrt(target)
    width = math.ceil(target / steps)
    if steps * width >= MAX_GAUSSIAN_VARIANCE:
        raise InvalidParameterError(f"grid {rounding.grid!r} is too fine for the noise multiplier {sigma!r} "
                                    f"(variance {steps * width} grid steps squared, below 2^54 needed)")
    return DiscreteGaussianPlan(rounding, steps, width)


def smoothing_log_ratio(steps: int, coordinates: int, smoothing: int = SMOOTHING) -> float:
    """Upper bound on |log(P_discrete / P_smoothed)| for a whole run: T n kappa.

    kappa = log((1 + eta)/(1 - eta)) bounds, per coordinate and step, the log-ratio of the discrete
    Gaussian's pmf to that of the smoothed continuous Gaussian (docs/theory/secure_noise.md §3), with
    eta = 2 sum_{m>=1} exp(-2 pi^2 tau^2 m^2) <= 2 e^{-a} / (1 - e^{-3a}), a = 2 pi^2 tau^2 (Poisson
    summation: Canonne, Kamath & Steinke, arXiv 2004.00010, Lemma on the normalising constant).
    Computed in log space and raised by 1e-12 relative (so it stays an upper bound after rounding).
    """
    steps = check_count("steps", steps, 0)
    coordinates = check_count("coordinates", coordinates, 1)
    tau = check_positive("smoothing", smoothing)
    a = 2.0 * math.pi ** 2 * tau ** 2
    if a < 10.0:
        raise InvalidParameterError(f"smoothing must be at least 1 grid step, got {smoothing!r}")
    log_eta = math.log(2.0) - a - math.log1p(-math.exp(-3.0 * a))
    eta = math.exp(log_eta)
    kappa = 2.0 * eta / (1.0 - eta)  # >= log1p(eta) - log1p(-eta)
    return steps * coordinates * kappa * (1.0 + 1e-12)


def discrete_log_ratio(history: list[tuple[DpEvent, int]]) -> float:
    """L of a ledger: the sum over its :class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent` s (with
    their repetitions) of :func:`smoothing_log_ratio`; 0 for a ledger without one."""
    def of(event: DpEvent, count: int) -> float:
        if isinstance(event, DiscreteGaussianStepEvent):
            return smoothing_log_ratio(count, event.coordinates, event.smoothing)
        if isinstance(event, SelfComposedEvent):
            return of(event.event, count * event.count)
        if isinstance(event, ComposedEvent):
            return sum(of(inner, count) for inner in event.events)
        return 0.0

    return sum(of(event, count) for event, count in history)


def continuous_event(event: DpEvent) -> DpEvent:
    """``event`` with every discrete step replaced by the continuous step it approximates (what the
    accountants' routes account before :func:`released_epsilon` corrects them)."""
    if isinstance(event, DiscreteGaussianStepEvent):
        return continuous_event(event.event)
    if isinstance(event, SelfComposedEvent):
        return SelfComposedEvent(continuous_event(event.event), event.count)
    if isinstance(event, ComposedEvent):
        return ComposedEvent(tuple(continuous_event(inner) for inner in event.events))
    return event


def released_epsilon(epsilon_at: Callable[[float], float], delta: float, log_ratio: float) -> float:
    """epsilon(delta) of a release whose pmf is within e^{+-L} (L = ``log_ratio``) of a post-processing of
    a mechanism with epsilon(delta) ``epsilon_at``: epsilon_at(delta e^{-L}) + 2 L (docs/theory/secure_noise.md
    §3.3).  Rounded toward privacy: delta given to ``epsilon_at`` rounded down, the sum rounded up; ``epsilon_at``
    itself where L = 0."""
    delta = check_delta("delta", delta)
    return epsilon_at(delta) if log_ratio == 0.0 else _corrected_release(epsilon_at, delta, log_ratio)


def _corrected_release(epsilon_at: Callable[[float], float], delta: float, log_ratio: float) -> float:
    return _corrected(epsilon_at(_shrunk_delta(delta, log_ratio)), log_ratio)


def released_delta(delta_at: Callable[[float], float], epsilon: float, log_ratio: float) -> float:
    """delta(epsilon) of the same release: e^L delta_at(epsilon - 2 L), capped at 1 (1 where epsilon <= 2 L),
    rounded up; ``delta_at`` itself where L = 0."""
    if log_ratio == 0.0:
        return delta_at(epsilon)
    continuous = epsilon - 2.0 * log_ratio
    if continuous <= 0.0:
        return 1.0
    # the continuous epsilon rounded down, the product rounded up
    below = math.nextafter(continuous, -math.inf)
    return min(1.0, delta_at(below) * math.exp(log_ratio) * (1.0 + 2.0 ** -50))


def discrete_gaussian_epsilon(epsilon_at: Callable[[float], float], delta: float, steps: int,
                              coordinates: int) -> float:
    """epsilon(delta) of the secure Gaussian run, from ``epsilon_at`` (the default Gaussian
    accountant's epsilon(delta) at the requested noise multiplier, T steps).

    With L = :func:`smoothing_log_ratio` (T, n): the discrete run's pmf is within e^{+-L} of a run of
    the continuous Gaussian mechanism put through post-processing, so it is
    (epsilon_at(delta e^{-L}) + 2 L, delta)-DP (:func:`released_epsilon`; rounded toward privacy even
    where T = 0, as :func:`discrete_gaussian_budget` assumes).
    """
    delta = check_delta("delta", delta)
    return _corrected_release(epsilon_at, delta, smoothing_log_ratio(steps, coordinates))


def _shrunk_delta(delta: float, log_ratio: float) -> float:
    """delta e^{-L}, rounded down (the factor 1 - 2^-50 absorbs the rounding of the product)."""
    return delta * math.exp(-log_ratio) * (1.0 - 2.0 ** -50)


def _corrected(epsilon: float, log_ratio: float) -> float:
    """epsilon + 2 L, rounded up."""
    return math.nextafter(epsilon + 2.0 * log_ratio, math.inf)


def discrete_gaussian_budget(target_epsilon: float, delta: float, steps: int, coordinates: int
                             ) -> tuple[float, float]:
    """(epsilon', delta') such that ``epsilon_at(delta') <= epsilon'`` implies
    ``discrete_gaussian_epsilon(epsilon_at, delta, steps, coordinates) <= target_epsilon``: the
    target a noise calibration for the continuous Gaussian must meet so that the secure run meets
    ``target_epsilon`` (docs/theory/secure_noise.md §3.3).

    delta' is the delta :func:`discrete_gaussian_epsilon` hands to the accountant (computed the
    same way); epsilon' is the largest float whose corrected value is at most the target, found
    by stepping down from target - 2 L (the correction is monotone in epsilon: float addition and
    nextafter are).  epsilon' <= 0 when no continuous epsilon meets the target.
    """
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_delta("delta", delta)
    log_ratio = smoothing_log_ratio(steps, coordinates)
    allowed = target_epsilon - 2.0 * log_ratio
    while allowed > 0 and _corrected(allowed, log_ratio) > target_epsilon:
        allowed = math.nextafter(allowed, -math.inf)
    return allowed, _shrunk_delta(delta, log_ratio)
