"""Finding the smallest noise that reaches a target epsilon: root finders for an epsilon non-increasing
in the noise, and the solve strategy of each built-in kind of accountant
(:attr:`~dpnoise.accounting.kinds.AccountantKind.solve`).

The strategies see a calibration through :class:`~dpnoise.accounting.kinds.NoiseRatioSearch` only,
so that the accountant modules, which register their kinds with these strategies, need not import
:mod:`~dpnoise.accounting.calibration`.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from dpnoise.accounting.kinds import NoiseRatioSearch
from dpnoise.accounting.pld.distribution import CONVERGED, pld_epsilon
from dpnoise.accounting.registry import get_spec
from dpnoise.accounting.validation import InvalidParameterError, check_positive

_LARGE = 1e12  # stands for +inf inside the root finder
#: the range a calibrated noise (per clip where the privacy depends on noise / clip) is searched in
NOISE_SEARCH_RANGE = (1e-8, 1e8)


class UnreachableTargetError(InvalidParameterError):
    """No value of the calibrated parameter reaches the target epsilon."""


#: Illinois steps before :func:`find_root` falls back on bisection (a function with jumps, e.g. on a PLD grid).
_ILLINOIS_STEPS = 60
_MAX_ROOT_STEPS = 300


def find_root(f: Callable[[float], float], low: float, high: float, *, xtol: float, rtol: float) -> float:
    """A root of ``f`` in [low, high], where f(low) and f(high) differ in sign, to within xtol + rtol |x|.

    The Illinois variant of regula falsi (Dowell & Jarratt, BIT 11, 1971: superlinear, order about 1.44,
    the bracket shrinking from both sides), then bisection if it has not converged.  Brent's method
    (``scipy.optimize.brentq``) would do as well, but importing scipy.optimize costs a command-line call
    about 0.15 s (it parses its docstrings); callers check the answer against their inequality anyway.
    """
    f_low, f_high = f(low), f(high)
    if f_low == 0 or f_high == 0:
        return low if f_low == 0 else high
    if (f_low > 0) == (f_high > 0):
        raise ValueError(f"find_root needs f(low) and f(high) of opposite signs, got {f_low!r} and {f_high!r}")
    replaced = None
    for step in range(_MAX_ROOT_STEPS):
        middle = 0.5 * (low + high)
        if high - low <= xtol + rtol * abs(middle):
            break
        x = (low * f_high - high * f_low) / (f_high - f_low) if step < _ILLINOIS_STEPS else middle
        x = x if low < x < high else middle
        f_x = f(x)
        if f_x == 0:
            return x
        if (f_x > 0) == (f_high > 0):
            high, f_high = x, f_x
            f_low = f_low / 2 if replaced == "high" else f_low  # low kept twice: halve its weight (Illinois)
            replaced = "high"
        else:
            low, f_low = x, f_x
            f_high = f_high / 2 if replaced == "low" else f_high
            replaced = "low"
    return 0.5 * (low + high)


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
    answer, saves evaluations), then :func:`find_root` on log x to the relative ``tolerance``; the
    answer is checked afterwards and nudged upwards until epsilon_of(x) <= target (never overshoots).
    """
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
    x = math.exp(find_root(f, math.log(lo), math.log(hi), xtol=tolerance, rtol=tolerance))
    nudge = 1e-12
    while epsilon_of(x) > target:  # the root may sit a hair on the wrong side
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


def solve_costly(epsilon_of: Callable[[float], float], target: float, initial: float, factor: float,
                  slope: float) -> tuple[float, float]:
    """(smallest x (to relative 1e-5) with epsilon_of(x) <= target, a slope of log epsilon there) for a
    costly ``epsilon_of``: the secant method (first step with ``slope``), or bracketing by ``factor``
    and Brent's method where the secant does not converge."""
    answer = solve_by_secant(epsilon_of, target, initial=initial, tolerance=1e-5, first_slope=slope)
    if answer is not None:
        return answer
    return solve_smallest(epsilon_of, target, initial=initial, factor=factor, tolerance=1e-5), slope


def solve_ratio(search: NoiseRatioSearch, accountant: str, initial: float, slope: float = -1.0) -> float:
    """The smallest noise ratio reaching ``search``'s target under ``accountant``, by the solve strategy of
    its kind; ``initial``: where the search starts; ``slope``: a guess of d log epsilon / d log ratio there."""
    return get_spec(accountant).accountant_kind.solve(search, accountant, initial, slope)


def solve_directly(search: NoiseRatioSearch, accountant: str, initial: float, slope: float) -> float:
    """For an accountant whose epsilon is cheap (an RDP curve): bracketing and Brent's method
    (:func:`solve_smallest`); the slope guess is not needed."""
    return solve_smallest(lambda ratio: search.epsilon(accountant, ratio), search.target, initial=initial)


def coarse_pld_epsilon(search: NoiseRatioSearch, accountant: str, ratio: float) -> float:
    """A PLD accountant's epsilon on its coarse grid alone: never below its own (the finer passes only
    lower it), and several times cheaper."""
    return pld_epsilon(search.ledger(accountant, ratio), search.delta, refine=False)[0]


def solve_by_pld_passes(search: NoiseRatioSearch, accountant: str, initial: float, slope: float) -> float:
    """For a PLD accountant: first on the coarse grid alone (a sound, slightly larger epsilon, cheap), then
    on the full two-pass value from that answer, each by the secant method (a composed PLD costs about a
    second; :func:`solve_by_secant`).  Where the finer passes lower epsilon at the coarse answer by less
    than CONVERGED (relative), the coarse answer stands: its epsilon is within target under both, and
    the refined search would move the noise by less than the refinement itself is trusted to matter
    (:func:`pld_epsilon` stops refining at the same threshold)."""
    def epsilon(ratio: float, refine: bool) -> float:
        return pld_epsilon(search.ledger(accountant, ratio), search.delta, refine=refine)[0]

    try:
        coarse, slope = solve_costly(lambda r: epsilon(r, False), search.target, initial, 1.25, slope)
    except UnreachableTargetError:
        # the coarse grid's own floor (tiny per-step losses spread to a grid step) is not the route's
        return solve_costly(lambda r: epsilon(r, True), search.target, initial, 1.25, slope)[0]
    if epsilon(coarse, True) >= epsilon(coarse, False) * (1.0 - CONVERGED):
        return coarse
    return solve_costly(lambda r: epsilon(r, True), search.target, coarse, 1.05, slope)[0]


def _log_slope(search: NoiseRatioSearch, accountant: str, ratio: float) -> float:
    """d log epsilon / d log ratio of ``accountant`` at ``ratio`` (by a 1% step), or -1 where not negative."""
    slope = math.log(search.epsilon(accountant, ratio * 1.01) / search.epsilon(accountant, ratio)) / math.log(1.01)
    return slope if slope < 0 else -1.0


def _above_target(search: NoiseRatioSearch, accountant: str, ratio: float) -> bool:
    """Whether ``accountant``'s epsilon at ``ratio`` exceeds the target; decided by its kind's cheaper upper
    bound where that is already within the target."""
    upper_bound = get_spec(accountant).accountant_kind.upper_bound
    if upper_bound is not None and upper_bound(search, accountant, ratio) <= search.target:
        return False
    return search.epsilon(accountant, ratio) > search.target


def solve_over_routes(search: NoiseRatioSearch, accountant: str, initial: float, slope: float) -> float:
    """For a minimum of routes: the smallest of the routes' answers (the minimum of non-increasing epsilons
    is <= target exactly where one of them is).  The routes with a cheap epsilon go first, and the others
    start from their answer with their slope there; a route that is not below target where another
    route already is cannot give a smaller answer and is skipped."""
    routes = get_spec(accountant).routes
    answers: list[float] = []
    failure: Optional[UnreachableTargetError] = None
    for route in sorted(routes, key=lambda r: not get_spec(r).accountant_kind.cheap_epsilon):
        if answers and _above_target(search, route, min(answers)):
            continue
        try:
            answers.append(solve_ratio(search, route, min(answers) if answers else initial, slope))
        except UnreachableTargetError as err:
            failure = err
            continue
        if get_spec(route).accountant_kind.cheap_epsilon:  # the slope there starts the costly routes' secant
            slope = _log_slope(search, route, answers[-1])
    if not answers:
        raise failure
    return min(answers)


__all__ = [
    "NOISE_SEARCH_RANGE",
    "UnreachableTargetError",
    "coarse_pld_epsilon",
    "solve_by_pld_passes",
    "solve_by_secant",
    "solve_costly",
    "solve_directly",
    "solve_over_routes",
    "solve_ratio",
    "solve_smallest",
]
