"""Our DP events as privacy loss distributions (PLDs), with pessimistic rounding and proven round-off bounds.

Each step's PLD is built here (:mod:`dpnoise.accounting.pld.single_step`) by pessimistic "connect
the dots" discretisation (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the dots: tighter
discrete approximations of privacy loss distributions", arXiv 2207.04380): in exact arithmetic every
epsilon(delta) of its PMFs is an upper bound on the true one, and each PMF carries a proven bound on
the relative error of its tail sums.  The steps are composed by tilted FFTs
(:mod:`dpnoise.accounting.pld.tilted`) whose float64 round-off is bounded entry by entry
(:mod:`dpnoise.accounting.pld.roundoff`); epsilon(delta) is the smallest epsilon whose delta(epsilon)
*with the bounds added* is at most delta.  Where the bounds alone exceed delta, the route answers
+inf and the default accountants use their RDP route.  dp_accounting (Google) is not used at run
time; the tests check against it.

Each mechanism event type has at most one PLD route (:class:`PldRoute`), registered by the
mechanism's plugin (:mod:`dpnoise.accounting.plugins`); the built-in ones:

* Gaussian and penultimate-gaussian: the Poisson-sampled Gaussian of noise multiplier sigma;
* Laplace with L1 clipping: the Poisson-sampled Laplace of scale b / C (the worst case of the L1
  ball is a one-coordinate shift of C);
* Lap2: no PLD of its own; one step is M_n-GDP (:func:`~dpnoise.accounting.pld.gdp.lap2_gdp_mu`),
  GDP dominating pairs survive Poisson subsampling and composition (Zhu, Dong & Wang, "Optimal
  accounting of differential privacy via characteristic function", arXiv 2106.08567), so the PLD
  of the Poisson-sampled Gaussian with noise multiplier 1/M_n bounds it;
* Dirichlet with two classes (an event recording ``num_classes == 2``): replace-one adjacency
  with the changed example's inclusion visible, one step being the vertex pair
  (1 - q) bot + q P_1 vs (1 - q) bot + q P_0, whose loss is 0 with probability 1 - q
  (:func:`~dpnoise.accounting.pld.dirichlet.two_class_vertex_pmfs`; docs/theory/dirichlet.md
  Sec. 1.3 and 2.4).  Not the add/remove subsampling of the others.  For more classes, or where
  the number of classes is not recorded, there is no PLD.

The PLD route is only attempted where its grid stays small (:func:`pld_feasibility`); elsewhere,
or where a PLD fails its checks (NaN, lost mass, masses outside their round-off bounds), it
reports "not computed" with the reason and the accountant falls back on its RDP route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional, Union

import numpy as np

from dpnoise.accounting.events import DpEvent, PoissonSampledEvent
from dpnoise.accounting.pld.bounded import ComposedPld
from dpnoise.accounting.pld.single_step import gaussian_pair
from dpnoise.accounting.pld.tilted import (
    GridPmf,
    composed_window_length,
    tilt_centred_at,
    tilt_for_delta,
    tilted_composition,
)
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError
from dpnoise.accounting.validation import InvalidParameterError

#: Value grid of the first pass: fine enough (about 0.1% of epsilon) from epsilon ~ 3 up.
COARSE_DISCRETIZATION = 1e-3
#: Later passes divide the grid by REFINEMENT, down to FINEST_DISCRETIZATION (cost grows as 1 / grid),
#: while a pass still lowers epsilon by more than the relative CONVERGED (geometric convergence: the
#: next pass would gain a fraction of that).
REFINEMENT = 5.0
FINEST_DISCRETIZATION = 1e-9
CONVERGED = 5e-3
#: Largest single-step grid (points) and number of compositions the PLD route attempts.
MAX_GRID_POINTS = 200_000
MAX_COMPOSITIONS = 100_000_000
MAX_COMPOSED_POINTS = 4_000_000
# Times the first pass coarsens its grid to fit the composed window within MAX_COMPOSED_POINTS.
_COARSENINGS = 3
# e^loss overflows beyond this loss.
_MAX_LAPLACE_LOSS = 700.0
# Beyond this single-step loss (sigma below ~0.003) the grid's loss values lose the precision its
# rounding bounds assume; such a noise has epsilon in the tens of thousands per step anyway.
_MAX_GAUSSIAN_LOSS = 1e5
# Largest tail-sum relative error accepted from a single-step PMF (ours are below 1e-9).
_MAX_TAIL_RELATIVE_ERROR = 1e-3
# Rounding slack on probability masses (FFT composition, truncation book-keeping).
_MASS_TOLERANCE = 1e-9
_EXCESS_MASS_PER_STEP = 1e-6


Ledger = tuple[tuple[DpEvent, int], ...]

#: the single-step PMFs of a Poisson-sampled mechanism event: (event, q, discretization) -> (remove, add)
SingleStepPmfs = Callable[[Any, float, float], tuple[GridPmf, GridPmf]]


def _always_available(event: Any) -> Optional[str]:
    return None


@dataclass(frozen=True)
class PldRoute:
    """How a mechanism event type is accounted by a PLD (its plugin registers it, :func:`register_pld`).

    ``loss_width(event, q)``: the width of the single-step privacy-loss support the grid must cover,
    or the reason the route is not attempted at these parameters (e.g. a loss that overflows);
    ``single_step(event, q, discretization)``: its pessimistic single-step PMFs (remove, add) on the grid,
    each with its proven tail-sum relative error;
    ``unavailable(event)``: why there is no PLD whatever the parameters and step count (None: there is).
    """

    loss_width: Callable[[Any, float], Union[float, str]]
    single_step: SingleStepPmfs
    unavailable: Callable[[Any], Optional[str]] = _always_available


_PLD_ROUTES: dict[type, PldRoute] = {}


def register_pld(event_type: type, route: PldRoute) -> PldRoute:
    """Register the PLD route of ``event_type`` (one per type)."""
    if event_type in _PLD_ROUTES:
        raise InvalidParameterError(f"a PLD route of {event_type.__name__} is already registered")
    _PLD_ROUTES[event_type] = route
    return route


def unregister_pld(event_type: type) -> None:
    """Remove the PLD route of ``event_type`` (and the cached PLDs)."""
    _PLD_ROUTES.pop(event_type, None)
    for cached in (single_step_pmfs, composed_pld, pld_epsilon, pld_delta):
        cached.cache_clear()


def sampled_loss_range(q: float, max_loss: float) -> float:
    """Width of the privacy-loss support of a q-sampled mechanism whose loss is at most ``max_loss``.

    Sampling maps a loss L to log(1 - q + q e^L) (and its negative in the other direction).
    """
    return 2.0 * float(np.logaddexp(np.log1p(-q), np.log(q) + max_loss)) if q < 1 else 2.0 * max_loss


def gaussian_loss_width(noise_multiplier: float, q: float) -> Union[float, str]:
    """:attr:`PldRoute.loss_width` of the Poisson-sampled Gaussian mechanism (sensitivity 1)."""
    if not 1e-100 < noise_multiplier < 1e100:  # sigma^2 and 1/sigma^2 stay finite
        return f"noise multiplier {noise_multiplier:g} out of the PLD route's range"
    # the Gaussian is truncated at |x| <= 10 sigma: loss up to 10/sigma + 1/(2 sigma^2)
    max_loss = gaussian_pair(noise_multiplier).max_loss
    if max_loss > _MAX_GAUSSIAN_LOSS:
        return f"Gaussian loss up to {max_loss:.3g} > {_MAX_GAUSSIAN_LOSS:g} (noise multiplier {noise_multiplier:g})"
    return sampled_loss_range(q, max_loss)


def laplace_loss_width(noise_multiplier: float, q: float) -> Union[float, str]:
    """:attr:`PldRoute.loss_width` of the Poisson-sampled Laplace mechanism (sensitivity 1)."""
    max_loss = 1.0 / noise_multiplier
    if max_loss > _MAX_LAPLACE_LOSS:
        return f"Laplace loss 1/{noise_multiplier:g} > {_MAX_LAPLACE_LOSS:g} overflows"
    return sampled_loss_range(q, max_loss)


def pld_unavailable(mechanism: DpEvent) -> Optional[str]:
    """Why ``mechanism`` (a mechanism event) has no PLD at all, whatever its parameters and step count
    (None when its plugin registered a PLD route that applies to it)."""
    route = _PLD_ROUTES.get(type(mechanism))
    if route is None:
        return f"no PLD for {type(mechanism).__name__}"
    return route.unavailable(mechanism)


def pld_feasibility(event: DpEvent, count: int) -> Optional[str]:
    """Why the PLD route is not attempted for ``count`` x ``event`` (None when it is)."""
    if not isinstance(event, PoissonSampledEvent):
        return f"PLD route covers Poisson-sampled mechanisms only, not {type(event).__name__}"
    unavailable = pld_unavailable(event.event)
    if unavailable is not None:
        return unavailable
    width = _loss_width(event)
    if isinstance(width, str):
        return width
    if count > MAX_COMPOSITIONS:
        return f"{count} steps > {MAX_COMPOSITIONS} (PLD composition too costly)"
    return None


def _loss_width(event: PoissonSampledEvent) -> Union[float, str]:
    return _PLD_ROUTES[type(event.event)].loss_width(event.event, event.sampling_probability)


def history_infeasibility(history: Ledger) -> Optional[str]:
    """Why the PLD route cannot account ``history`` (None when it can)."""
    for event, count in history:
        reason = pld_feasibility(event, count)
        if reason is not None:
            return reason
    return None


def history_discretization(history: Ledger, discretization: float) -> float:
    """The value grid used for ``history`` where ``discretization`` is asked for: coarser where a
    single step's loss support would need more than MAX_GRID_POINTS points."""
    return max(discretization, *(_loss_width(event) / MAX_GRID_POINTS for event, _ in history))


def checked_pmfs(pmfs: tuple[GridPmf, ...], source: str) -> tuple[GridPmf, ...]:
    """The single-step ``pmfs`` (remove and add directions) after checking each.

    Finite, nonnegative masses; infinity mass in [0, 1]; total mass (infinity included) not below 1
    (lost mass could hide privacy loss) and at most 1 + 2e-6 (pessimistic rounding adds a little mass,
    which can only raise delta(epsilon); the upper check catches gross failures only); a tail-sum
    relative error in [0, 1e-3].
    """
    for direction, pmf in zip(("remove", "add"), pmfs):
        probs, infinity_mass = pmf.probs, pmf.infinity_mass
        if not np.all(np.isfinite(probs)) or np.any(probs < 0):
            raise InvalidPrivacyCurveError(f"{source}: PLD has NaN or negative mass; refusing to report an epsilon")
        total = float(probs.sum()) + infinity_mass
        excess_allowed = 2 * _EXCESS_MASS_PER_STEP
        if not 0.0 <= infinity_mass <= 1.0 + _MASS_TOLERANCE or not 1.0 - _MASS_TOLERANCE <= total <= 1.0 + excess_allowed:
            raise InvalidPrivacyCurveError(
                f"{source}: PLD masses are invalid ({direction} direction: total {total:.12g}, "
                f"infinity mass {infinity_mass:.3g}); refusing to report an epsilon"
            )
        if not 0.0 <= pmf.tail_relative_error <= _MAX_TAIL_RELATIVE_ERROR:
            raise InvalidPrivacyCurveError(f"{source}: tail-sum error {pmf.tail_relative_error:.3g} of the {direction} "
                                           f"direction out of range; refusing to report an epsilon")
    return pmfs


class PldTooCostly(ArithmeticError):
    """The composed PLD would need a grid too large to compute in reasonable time (``points``: its size,
    when it is the composed window's)."""

    def __init__(self, message: str, points: float = math.inf) -> None:
        super().__init__(message)
        self.points = points


_DIRECTIONS = 2  # remove, add


@lru_cache(maxsize=64)
def single_step_pmfs(event: PoissonSampledEvent, discretization: float) -> tuple[GridPmf, ...]:
    """The checked single-step PMFs of ``event`` (remove and add directions) on the grid."""
    route = _PLD_ROUTES[type(event.event)]
    return checked_pmfs(route.single_step(event.event, event.sampling_probability, discretization), f"PLD of {event}")


def _directions(history: Ledger, discretization: float) -> list[list[tuple[GridPmf, int]]]:
    """Per direction, the single-step PMF of each event of ``history`` with its count."""
    pmfs = [(single_step_pmfs(event, discretization), count) for event, count in history]
    return [[(pair[index], count) for pair, count in pmfs] for index in range(_DIRECTIONS)]


@lru_cache(maxsize=128)
def composed_pld(history: Ledger, discretization: float, tilts: tuple[float, ...]) -> ComposedPld:
    """The PLD of ``history`` (events with repetition counts) composed by tilted FFTs
    (:mod:`dpnoise.accounting.pld.tilted`), one tilt per direction, with proven entry bounds.

    Raises :class:`PldTooCostly` when a direction's window exceeds MAX_COMPOSED_POINTS and
    :class:`InvalidPrivacyCurveError` when a PLD is invalid (NaN, or masses outside their checks).
    """
    directions = _directions(history, discretization)
    for steps, tilt in zip(directions, tilts):
        points = composed_window_length(steps, tilt, discretization)
        if points > MAX_COMPOSED_POINTS:
            raise PldTooCostly(f"the composed PLD needs a grid of {points} points > {MAX_COMPOSED_POINTS}", points)
    composed = tuple(tilted_composition(steps, discretization, tilt) for steps, tilt in zip(directions, tilts))
    for direction in composed:
        if not (np.all(np.isfinite(direction.probs)) and math.isfinite(direction.infinity_mass)):
            raise InvalidPrivacyCurveError(f"PLD of {sum(count for _, count in history)} composed step(s) has NaN "
                                           f"or infinite mass")
    return ComposedPld(composed)


Tilts = tuple[float, ...]


def _epsilon_on_grid(history: Ledger, discretization: float, delta: float,
                     near: Optional[Tilts] = None) -> tuple[float, Tilts]:
    """(epsilon(delta), the tilt of each direction) on one grid; ``near``: the tilts of a coarser grid."""
    directions = _directions(history, discretization)
    tilts = tuple(tilt_for_delta(steps, discretization, delta, near[index] if near else None)
                  for index, steps in enumerate(directions))
    return composed_pld(history, discretization, tilts).epsilon_for_delta(delta), tilts


def _first_pass(history: Ledger, delta: float) -> tuple[float, float, Tilts]:
    """(epsilon, grid, tilts) on the coarse grid, made coarser where the composed window would be too
    large (e.g. 10^7 steps at q = 1)."""
    grid = history_discretization(history, COARSE_DISCRETIZATION)
    for _ in range(_COARSENINGS):
        try:
            epsilon, tilts = _epsilon_on_grid(history, grid, delta)
            return epsilon, grid, tilts
        except PldTooCostly as err:
            if not math.isfinite(err.points):
                raise
            grid *= 1.25 * err.points / MAX_COMPOSED_POINTS
    epsilon, tilts = _epsilon_on_grid(history, grid, delta)
    return epsilon, grid, tilts


def _expected_refinement_gain(history: Ledger, grid: float, delta: float, tilts: Tilts, epsilon: float) -> float:
    """The relative drop of ``epsilon`` (found on ``grid``) a pass REFINEMENT times finer should bring,
    extrapolated to first order from a pass on twice the grid (cheaper: half the points); +inf where that
    pass fails.  Connect-the-dots PLDs converge faster than first order wherever the grid resolves the
    per-step loss (the estimate then runs about 2.5 times the real gain); where it does not (q ~ 1e-4),
    both grids are off by tens of percent and the estimate says to refine."""
    try:
        coarser, _ = _epsilon_on_grid(history, 2.0 * grid, delta, tilts)
    except (PldTooCostly, ArithmeticError, ValueError):
        return math.inf
    return abs(coarser - epsilon) * (1.0 - 1.0 / REFINEMENT) / epsilon


@lru_cache(maxsize=1024)
def pld_epsilon(history: Ledger, delta: float, refine: bool = True) -> tuple[float, Optional[str]]:
    """(epsilon(delta), None), or (+inf, reason) when the PLD route does not apply or cannot certify ``delta``.

    Passes on ever finer value grids (``refine``): a coarse one, then, unless a pass on twice the coarse
    grid shows that refining would lower epsilon by less than CONVERGED / 2
    (:func:`_expected_refinement_gain`), grids REFINEMENT times finer while a pass still lowers epsilon
    by more than CONVERGED and its PLD stays within the size limits;
    every pass is pessimistic and carries its round-off bound, so the smallest result is reported.
    (A small per-step loss, e.g. q = 1e-4, needs a grid finer than the loss itself.)  A PLD that cannot
    be built (its numerics fail, or its masses break their checks) gives +inf with the reason: the default
    accountants then answer by RDP.
    """
    reason = history_infeasibility(history)
    if reason is not None:
        return math.inf, reason
    try:
        best, grid, tilts = _first_pass(history, delta)
        refine = refine and math.isfinite(best) and _expected_refinement_gain(history, grid, delta, tilts, best) >= CONVERGED / 2
        while refine and math.isfinite(best):
            finer = history_discretization(history, max(grid / REFINEMENT, FINEST_DISCRETIZATION))
            if finer > 0.5 * grid:
                break
            try:
                refined, tilts = _epsilon_on_grid(history, finer, delta, tilts)
            except PldTooCostly:
                break  # the coarser grid's epsilon stands
            improved = refined < best * (1.0 - CONVERGED)
            best, grid = min(best, refined), finer
            if not improved:
                break
    except PldTooCostly as err:
        return math.inf, str(err)
    except (ArithmeticError, ValueError) as err:  # the numerics or our checks gave up
        return math.inf, f"PLD not valid ({type(err).__name__}: {err})"
    if not math.isfinite(best):
        return math.inf, f"round-off bound of the composed PLD exceeds delta = {delta:g}"
    return best, None


@lru_cache(maxsize=1024)
def pld_delta(history: Ledger, epsilon: float) -> tuple[float, Optional[str]]:
    """(delta(epsilon), None) on the coarse grid, round-off included, or (1.0, reason) when the PLD
    route does not apply."""
    reason = history_infeasibility(history)
    if reason is not None:
        return 1.0, reason
    try:
        grid = history_discretization(history, COARSE_DISCRETIZATION)
        tilts = tuple(tilt_centred_at(steps, grid, epsilon) for steps in _directions(history, grid))
        return min(1.0, composed_pld(history, grid, tilts).delta_for_epsilon(epsilon)), None
    except PldTooCostly as err:
        return 1.0, str(err)
    except (ArithmeticError, ValueError) as err:
        return 1.0, f"PLD not valid ({type(err).__name__}: {err})"
