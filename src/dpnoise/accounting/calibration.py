"""Calibrating a noise parameter to a target (epsilon, delta).

Every calibrator returns a value whose epsilon is checked, after solving, to be <= the target
(never overshoots), and raises :class:`UnreachableTargetError` naming the floor when no value
of the parameter reaches the target.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from dpnoise.accounting.accountant import UnsoundAccountantWarning, accountant_holding, epsilon_of_events, flat_ledger
from dpnoise.accounting.events import DpEvent, PoissonSampledEvent
from dpnoise.accounting.mechanisms import get_mechanism_spec
from dpnoise.accounting.pld.distribution import pld_epsilon
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError
from dpnoise.accounting.registry import accountants_for_mechanism, get_spec
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_count,
    check_delta,
    check_positive,
    check_sample_rate,
)

_LARGE = 1e12  # stands for +inf inside the root finder
#: the most steps accounted: beyond, step counts are no longer exact integers in floating point
MAX_STEPS = 2**53 - 1
#: the range a calibrated noise (per clip where the privacy depends on noise / clip) is searched in
NOISE_SEARCH_RANGE = (1e-8, 1e8)


class UnreachableTargetError(InvalidParameterError):
    """No value of the calibrated parameter reaches the target epsilon."""


def steps_from_epochs(epochs: float, sample_rate: float) -> int:
    """T = ceil(epochs / q): the number of Poisson-sampled steps covering ``epochs`` (rounded up; a
    quotient within 1e-9 of an integer counts as that integer).  Fewer than one step is refused: a run
    that takes no step has nothing to account."""
    epochs = check_positive("epochs", epochs)
    q = check_sample_rate("sample_rate", sample_rate)
    steps = epochs / q
    if not steps <= MAX_STEPS:
        raise InvalidParameterError(f"epochs={epochs:g} at sample rate {q:g} is {steps:.3g} steps: too many to account")
    count = int(math.ceil(steps - 1e-9))
    if count < 1:
        raise InvalidParameterError(f"epochs={epochs:g} at sample rate {q:g} is {steps:.3g} steps: "
                                    "fewer than one step")
    return count


def solve_smallest(
    epsilon_of: Callable[[float], float],
    target: float,
    *,
    initial: float = 1.0,
    lower: float = NOISE_SEARCH_RANGE[0],
    upper: float = NOISE_SEARCH_RANGE[1],
    name: str = "noise",
    factor: float = 2.0,
    tolerance: float = 1e-9,
) -> float:
    """Smallest x in [lower, upper] with epsilon_of(x) <= target, for epsilon_of non-increasing in x.

    Brackets by powers of ``factor`` from ``initial`` (a good guess, e.g. a looser accountant's
    answer, saves evaluations), then Brent's method on log x to the relative ``tolerance``; the
    answer is checked afterwards and nudged upwards until epsilon_of(x) <= target (never overshoots).
    """
    from scipy.optimize import brentq  # noqa: PLC0415 (slow import, needed by calibrations only)

    target = check_positive("target epsilon", target)

    def f(log_x: float) -> float:
        return min(epsilon_of(math.exp(log_x)), _LARGE) - target

    hi = min(max(initial, lower), upper)
    while f(math.log(hi)) > 0:
        if hi >= upper:
            floor = epsilon_of(upper)
            if not math.isfinite(floor):
                raise UnreachableTargetError(
                    f"epsilon={target:g} is unreachable by this accountant: it certifies no finite epsilon "
                    f"at any {name} up to {upper:g} for these sampling/step/delta settings (its route cannot "
                    f"certify this delta); use the default accountant or a larger delta")
            raise UnreachableTargetError(
                f"epsilon={target:g} is unreachable: even {name}={upper:g} gives epsilon={floor:.4g} "
                f"(the floor for these sampling/step/delta settings); raise epsilon or delta, or "
                f"lower the number of steps or the sample rate"
            )
        hi = min(hi * factor, upper)
    lo = hi
    while f(math.log(lo)) <= 0:
        if lo <= lower:
            return lower
        lo = max(lo / factor, lower)
    x = math.exp(brentq(f, math.log(lo), math.log(hi), xtol=tolerance, rtol=tolerance))
    nudge = 1e-12
    while epsilon_of(x) > target:  # Brent's answer may sit a hair on the wrong side
        x = min(x * (1.0 + nudge), hi)
        nudge *= 4.0
    return x


def solve_by_secant(
    epsilon_of: Callable[[float], float],
    target: float,
    *,
    initial: float,
    tolerance: float,
    first_slope: float = -1.0,
    max_evaluations: int = 10,
    bounds: tuple[float, float] = NOISE_SEARCH_RANGE,
) -> Optional[tuple[float, float]]:
    """(x, the last secant slope) with epsilon_of(x) <= target, x within relative ``tolerance`` of the
    smallest such x in ``bounds``; or None.

    For an ``epsilon_of`` that is costly (a composed PLD), smooth and decreasing in x: the secant
    method on g(u) = log epsilon_of(e^u) - log target, from u = log ``initial`` with slope
    ``first_slope`` (d log epsilon / d log x; about -1 for large noise) for the first step.  From a
    start within ~20% it takes 3 to 6 evaluations, where bracketing by powers and Brent's method take
    8 to 20.  Each step aims ``tolerance`` / 2 (in log x) above the root, so that converged points
    are on the admissible side; once points on both sides are known, every step stays between them
    (bisection otherwise).  The answer is an evaluated x with epsilon <= target from which the next
    step would be shorter than ``tolerance``, or that closes the bracket to ``tolerance``.  None when
    neither happens within ``max_evaluations``, or epsilon is not a positive number (e.g. 0 at a
    huge noise) or is infinite before an admissible point is known, or a step leaves ``bounds``: the
    caller falls back on :func:`solve_smallest`, which says when the target is out of reach.
    """
    log_target = math.log(check_positive("target epsilon", target))

    def g(u: float) -> float:
        epsilon = epsilon_of(math.exp(u))
        return math.log(epsilon) - log_target if epsilon > 0 else math.nan

    u, slope = math.log(min(max(initial, bounds[0]), bounds[1])), first_slope
    value = g(u)
    admissible, refused = math.inf, -math.inf  # smallest u known with g <= 0, largest with g > 0
    for _ in range(max_evaluations):
        if math.isnan(value):
            return None
        if value <= 0:
            admissible = min(admissible, u)
        else:
            refused = max(refused, u)
        step = -value / slope + tolerance / 2 if math.isfinite(value) and slope < 0 else math.nan
        if admissible - refused <= tolerance or (value <= 0 and abs(step) <= tolerance):
            return math.exp(admissible), slope
        proposal = u + step
        if not refused < proposal < admissible:
            proposal = (refused + admissible) / 2
        if not math.log(bounds[0]) <= proposal <= math.log(bounds[1]):
            return None
        new_value = g(proposal)
        if math.isfinite(new_value) and math.isfinite(value):
            slope = (new_value - value) / (proposal - u)
        u, value = proposal, new_value
    return None


def _solve_costly(epsilon_of: Callable[[float], float], target: float, initial: float, factor: float,
                  slope: float) -> tuple[float, float]:
    """(smallest x (to relative 1e-5) with epsilon_of(x) <= target, a slope of log epsilon there) for a
    costly ``epsilon_of``: the secant method (first step with ``slope``), or bracketing by ``factor``
    and Brent's method where the secant does not converge."""
    answer = solve_by_secant(epsilon_of, target, initial=initial, tolerance=1e-5, first_slope=slope)
    if answer is not None:
        return answer
    return solve_smallest(epsilon_of, target, initial=initial, factor=factor, tolerance=1e-5), slope


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated parameter and the epsilon it achieves under each applicable accountant.

    ``noise`` is in the mechanism's unit, whose keyword is :attr:`noise_keyword`
    (``noise_multiplier``, ``laplace_scale`` or ``concentration``); :meth:`noise_arguments`
    gives ``{keyword: noise}`` for ``make_private`` or an accountant's ``step``.
    """

    mechanism: str
    accountant: str
    noise: float
    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    clip: float = 1.0
    params: Optional[int] = None
    alpha: Optional[float] = None
    epsilon_by_accountant: dict[str, float] = field(default_factory=dict)
    initial_guess: Optional[float] = None
    #: the number of classes the Dirichlet epsilon was computed for (None: any)
    num_classes: Optional[int] = None

    @property
    def noise_keyword(self) -> str:
        return get_mechanism_spec(self.mechanism).noise.keyword

    def noise_arguments(self) -> dict[str, float]:
        return {self.noise_keyword: self.noise}


#: noise in the mechanism's unit -> the DP event of one training step: what the calibrators search
StepEventFactory = Callable[[float], DpEvent]


def step_event_factory(mechanism: str, sample_rate: float, *, clip: float = 1.0, params: Optional[int] = None,
                       alpha: Optional[float] = None, num_classes: Optional[int] = None) -> StepEventFactory:
    """``noise -> PoissonSampledEvent(sample_rate, the mechanism's event at that noise)`` for a run with
    these settings (:meth:`~dpnoise.accounting.mechanisms.MechanismSpec.build_event`, checked once here)."""
    spec = get_mechanism_spec(mechanism)
    q = check_sample_rate("sample_rate", sample_rate)
    spec.build_event(1.0, clip, params, alpha, num_classes)  # refuses settings the mechanism does not take

    def step_event(noise: float) -> DpEvent:
        return PoissonSampledEvent(q, spec.build_event(noise, clip, params, alpha, num_classes))

    return step_event


def epsilon_at_noise(accountant: str, step_event: StepEventFactory, noise: float, steps: int, delta: float,
                     releases: Sequence[DpEvent] = ()) -> float:
    """Epsilon of ``accountant`` after ``releases`` and ``steps`` x ``step_event(noise)`` (no unsound-accountant
    warning)."""
    return epsilon_of_events(accountant, step_event(noise), steps=steps, delta=delta, releases=releases)


def validated_target(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> tuple[float, float, float, int]:
    return (
        check_positive("epsilon", target_epsilon),
        check_delta("delta", delta),
        check_sample_rate("sample_rate", sample_rate),
        check_count("steps", steps, 1),
    )


def gaussian_initial_noise(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Closed-form starting point sigma* = 2 q sqrt(T log(1/delta)) / eps.

    From the small-q sampled-Gaussian RDP D_a ~ a q^2 / sigma^2 and eps ~ min_a [T a q^2 / sigma^2
    + log(1/delta) / (a - 1)], minimised at a ~ sigma sqrt(log(1/delta) / T) / q.  By Gaussian
    domination (docs/theory/lap2.md §4 (b)) it is also the starting ratio b*/C for Lap2: the Lap2 paper's
    garbled b* ~ (2 q / eps) T log(1/delta) C with the square root restored.
    """
    return 2.0 * sample_rate * math.sqrt(steps * math.log(1.0 / delta)) / target_epsilon


def calibrate_noise(
    accountant: str,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    clip: float = 1.0,
    params: Optional[int] = None,
    compare: bool = True,
    releases: Sequence[DpEvent] = (),
) -> CalibrationResult:
    """Smallest noise reaching the target, in the mechanism's unit (:attr:`CalibrationResult.noise_keyword`).

    ``compare``: also give the epsilon of that noise under the mechanism's other reported
    accountants (``epsilon_by_accountant``; PLD routes can cost more than the calibration itself).
    ``releases``: DP events composed before the steps (e.g. noisy statistics of the training data,
    :mod:`dpnoise.mechanisms.channel_statistics`); the target covers them and the steps together.
    """
    releases = tuple(releases)
    eps_t, delta, q, steps = validated_target(target_epsilon, delta, sample_rate, steps)
    spec = get_spec(accountant)
    own = get_mechanism_spec(spec.mechanism).calibrate
    if own is not None:
        raise InvalidParameterError(f"mechanism {spec.mechanism!r} has its own calibrator ({own.__name__}); "
                                    f"use calibrate({accountant!r}, ...)")
    if not spec.sound:
        warnings.warn(spec.warning or "", UnsoundAccountantWarning, stacklevel=2)
    clip = check_positive("clip", clip)
    step_event = step_event_factory(spec.mechanism, q, clip=clip, params=params)
    if releases:
        spent = epsilon_at_noise(accountant, step_event, 1.0, 0, delta, releases)  # no step
        if spent >= eps_t:
            raise UnreachableTargetError(f"epsilon={eps_t:g} is unreachable: the releases before training alone "
                                         f"cost epsilon={spent:.4g} under {accountant} (delta={delta:g})")
    scale = _noise_scale(accountant, clip)
    guess = gaussian_initial_noise(eps_t, delta, q, steps)
    ratio = _smallest_ratio(accountant, step_event, scale, eps_t, delta, steps, max(guess, 1e-3), releases)
    noise = ratio * scale
    by_acc = {
        name: epsilon_at_noise(name, step_event, noise, steps, delta, releases)
        for name in dict.fromkeys([accountant, *(accountants_for_mechanism(spec.mechanism) if compare else [])])
    }
    if by_acc[accountant] > eps_t:  # every route checks its answer; this guards the combination
        raise InvalidPrivacyCurveError(f"calibration of {accountant} gave epsilon {by_acc[accountant]} > {eps_t}")
    return CalibrationResult(
        spec.mechanism, accountant, noise, by_acc[accountant], delta, q, steps, clip, params,
        epsilon_by_accountant=by_acc, initial_guess=guess * scale,
    )


def _smallest_ratio(
    accountant: str, step_event: StepEventFactory, scale: float, target: float, delta: float, steps: int,
    initial: float, releases: tuple[DpEvent, ...] = (), slope: float = -1.0,
) -> float:
    """Smallest noise / ``scale`` (Laplace: b / C; else sigma) whose ``steps`` x ``step_event(noise)``, after
    ``releases``, reaches ``target`` under ``accountant``.

    ``initial``: where the search starts; ``slope``: a guess of d log epsilon / d log ratio there.

    * a minimum of routes: the smallest of the routes' answers (the minimum of non-increasing
      epsilons is <= target exactly where one of them is); the fast RDP routes go first, and the
      others start from their answer with their slope there;
    * a PLD accountant: first on the coarse grid alone (a sound, slightly larger epsilon, cheap),
      then on the full two-pass value from that answer, each by the secant method (a composed PLD
      costs about a second; :func:`solve_by_secant`);
    * an RDP accountant: directly.
    """
    spec = get_spec(accountant)

    def ledger(ratio: float):
        return flat_ledger(accountant_holding(accountant, releases).compose(step_event(ratio * scale), steps).history)

    if spec.kind == "minimum":
        def route_epsilon(route: str, ratio: float) -> float:
            return epsilon_at_noise(route, step_event, ratio * scale, steps, delta, releases)

        answers, failure = [], None
        for route in sorted(spec.routes, key=lambda r: get_spec(r).kind != "rdp"):
            if answers and route_epsilon(route, min(answers)) > target:
                continue  # not below target where another route already is: its answer is not smaller
            try:
                answers.append(_smallest_ratio(route, step_event, scale, target, delta, steps,
                                               min(answers) if answers else initial, releases, slope))
            except UnreachableTargetError as err:
                failure = err
                continue
            if get_spec(route).kind == "rdp":  # the slope there starts the costly routes' secant
                found = answers[-1]
                slope = math.log(route_epsilon(route, found * 1.01) / route_epsilon(route, found)) / math.log(1.01)
                slope = slope if slope < 0 else -1.0
        if not answers:
            raise failure
        return min(answers)
    if spec.kind == "pld":
        try:
            coarse, slope = _solve_costly(lambda r: pld_epsilon(ledger(r), delta, refine=False)[0], target, initial,
                                          1.25, slope)
        except UnreachableTargetError:
            # the coarse grid's own floor (tiny per-step losses spread to a grid step) is not the route's
            return _solve_costly(lambda r: pld_epsilon(ledger(r), delta)[0], target, initial, 1.25, slope)[0]
        if pld_epsilon(ledger(coarse), delta)[0] == pld_epsilon(ledger(coarse), delta, refine=False)[0]:
            return coarse  # no refinement at this epsilon: the same function, the same answer
        return _solve_costly(lambda r: pld_epsilon(ledger(r), delta)[0], target, coarse, 1.05, slope)[0]

    def eps_of(ratio: float) -> float:
        return epsilon_at_noise(accountant, step_event, ratio * scale, steps, delta, releases)

    return solve_smallest(eps_of, target, initial=initial)


def _noise_scale(accountant: str, clip: float) -> float:
    """C for mechanisms whose privacy depends on noise / C only (solved as a ratio), else 1."""
    return clip if get_mechanism_spec(get_spec(accountant).mechanism).noise.per_clip else 1.0


def clip_from_gradient_norms(norms: np.ndarray, percentile: float = 50.0) -> float:
    """C as a percentile of per-example gradient norms (Lap2 paper Sec. IV-B).

    Compute ``norms`` on PUBLIC or held-out data: a percentile of the private data's norms is
    itself a release that this library does not account for.
    """
    norms = np.asarray(norms, dtype=float)
    if norms.size == 0 or not np.all(np.isfinite(norms)) or np.any(norms < 0):
        raise InvalidParameterError("norms must be a non-empty array of finite non-negative numbers")
    return check_positive("clip (percentile of norms)", float(np.percentile(norms, percentile)))


def calibrate(
    accountant: str,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    clip: float = 1.0,
    params: Optional[int] = None,
    alpha: Optional[float] = None,
    num_classes: Optional[int] = None,
    releases: Sequence[DpEvent] = (),
) -> CalibrationResult:
    """The noise of ``accountant``'s mechanism reaching (target_epsilon, delta) after ``steps`` steps,
    by the mechanism's own calibrator where its spec has one (the Dirichlet r), else
    :func:`calibrate_noise`.  ``alpha`` and ``num_classes`` are refused by a mechanism that does not
    take them; ``releases`` (events before the steps) by one with its own calibrator."""
    mechanism = get_mechanism_spec(get_spec(accountant).mechanism)
    mechanism.build_event(1.0, clip, params, alpha, num_classes)  # refuses what the mechanism does not take
    if mechanism.calibrate is None:
        return calibrate_noise(accountant, target_epsilon, delta, sample_rate, steps, clip=clip, params=params,
                               releases=releases)
    if releases:
        raise InvalidParameterError(f"releases before training are not accounted for mechanism {mechanism.name!r}")
    return mechanism.calibrate(accountant, target_epsilon, delta, sample_rate, steps, alpha=alpha,
                               num_classes=num_classes)
