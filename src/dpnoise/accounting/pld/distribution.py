"""Our DP events as privacy loss distributions (PLDs) of dp_accounting, with pessimistic rounding.

dp_accounting (Google, https://github.com/google/differential-privacy, ``dp_accounting.pld``)
builds the PLD of the Poisson-sampled Gaussian and Laplace mechanisms under add/remove adjacency
with "connect the dots" pessimistic discretisation (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi,
"Connect the dots: tighter discrete approximations of privacy loss distributions",
arXiv 2207.04380): in exact arithmetic every epsilon(delta) of its PLDs is an upper bound on the
true one.  Its FFT composition is not exact: its float64 round-off is an absolute error per mass,
which at deltas of 1e-10 and below is of the order of delta itself.  So this module does not ask
dp_accounting for epsilon(delta); each composed PLD carries a proven bound on that round-off
(:mod:`dpnoise.accounting.pld.roundoff`), and epsilon(delta) is the smallest epsilon whose
delta(epsilon) *with the bound added* is at most delta.  Where the bound alone exceeds delta,
the route answers +inf and the default accountants use their RDP route.

Each mechanism event type has at most one PLD route (:class:`PldRoute`), registered by the
mechanism's plugin (:mod:`dpnoise.accounting.plugins`); the built-in ones:

* Gaussian and penultimate-gaussian: ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``;
* Laplace with L1 clipping: ``PoissonSampledDpEvent(q, LaplaceDpEvent(b / C))`` (the worst case of
  the L1 ball is a one-coordinate shift of C);
* Lap2: no PLD of its own; one step is M_n-GDP (:func:`~dpnoise.accounting.pld.gdp.lap2_gdp_mu`),
  GDP dominating pairs survive Poisson subsampling and composition (Zhu, Dong & Wang, "Optimal
  accounting of differential privacy via characteristic function", arXiv 2106.08567), so the PLD
  of the Poisson-sampled Gaussian with noise multiplier 1/M_n bounds it;
* Dirichlet with two classes (an event recording ``num_classes == 2``): replace-one adjacency
  with the changed example's inclusion visible, one step being the vertex pair
  (1 - q) bot + q P_1 vs (1 - q) bot + q P_0, whose loss is 0 with probability 1 - q
  (:func:`~dpnoise.accounting.pld.dirichlet.two_class_vertex_pld`; docs/theory/dirichlet.md
  Sec. 1.3 and 2.4).  Not dp_accounting's add/remove subsampling.  For more classes, or where
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
from dpnoise.accounting.pld.roundoff import (
    composition_relative_error,
    convolution_entry_error,
    self_convolution_entry_error,
    self_convolution_length,
    summation_error_factor,
)
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError
from dpnoise.accounting.validation import InvalidParameterError

#: Value grid of the first pass: fine enough (about 0.1% of epsilon) from epsilon ~ 3 up.
COARSE_DISCRETIZATION = 1e-3
#: Second pass, where the first gave a smaller epsilon: a grid of epsilon / REFINEMENT, not finer
#: than FINEST_DISCRETIZATION (cost grows as 1 / grid).
REFINEMENT = 3000.0
FINEST_DISCRETIZATION = 2e-5
#: Largest single-step grid (points) and number of compositions the PLD route attempts.
MAX_GRID_POINTS = 200_000
MAX_COMPOSITIONS = 1_000_000
MAX_COMPOSED_POINTS = 4_000_000
# dp_accounting evaluates q * exp(max loss); beyond this loss it overflows.
_MAX_LAPLACE_LOSS = 700.0
# Rounding slack on probability masses (FFT composition, truncation book-keeping).
_MASS_TOLERANCE = 1e-9
_EXCESS_MASS_PER_STEP = 1e-6
# dp_accounting's default tail truncation of the Gaussian: |x| <= sqrt(2 * 50) sigma.
_GAUSSIAN_TAIL = math.sqrt(100.0)


#: the single-step PLD of a Poisson-sampled mechanism event: (event, q, discretization) -> dp_accounting PLD
SingleStepPld = Callable[[Any, float, float], Any]


def _always_available(event: Any) -> Optional[str]:
    return None


@dataclass(frozen=True)
class PldRoute:
    """How a mechanism event type is accounted by a PLD (its plugin registers it, :func:`register_pld`).

    ``loss_width(event, q)``: the width of the single-step privacy-loss support the grid must cover,
    or the reason the route is not attempted at these parameters (e.g. outside dp_accounting's range);
    ``single_step(event, q, discretization)``: its pessimistic single-step PLD;
    ``unavailable(event)``: why there is no PLD whatever the parameters and step count (None: there is).
    """

    loss_width: Callable[[Any, float], Union[float, str]]
    single_step: SingleStepPld
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
    for cached in (composed_pld, pld_epsilon, pld_delta):
        cached.cache_clear()


def sampled_loss_range(q: float, max_loss: float) -> float:
    """Width of the privacy-loss support of a q-sampled mechanism whose loss is at most ``max_loss``.

    Sampling maps a loss L to log(1 - q + q e^L) (and its negative in the other direction).
    """
    return 2.0 * float(np.logaddexp(np.log1p(-q), np.log(q) + max_loss)) if q < 1 else 2.0 * max_loss


def gaussian_loss_width(noise_multiplier: float, q: float) -> Union[float, str]:
    """:attr:`PldRoute.loss_width` of the Poisson-sampled Gaussian mechanism (sensitivity 1)."""
    if not 1e-100 < noise_multiplier < 1e100:  # dp_accounting squares sigma
        return f"noise multiplier {noise_multiplier:g} out of the PLD route's range"
    # dp_accounting truncates the Gaussian at |x| <= 10 sigma: loss up to 10/sigma + 1/(2 sigma^2).
    return sampled_loss_range(q, _GAUSSIAN_TAIL / noise_multiplier + 0.5 / noise_multiplier / noise_multiplier)


def gaussian_pld(noise_multiplier: float, q: float, discretization: float) -> Any:
    """dp_accounting's pessimistic PLD of the Poisson-sampled Gaussian mechanism (add/remove)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: PLC0415 (slow import)

    return pld_lib.from_gaussian_mechanism(noise_multiplier, pessimistic_estimate=True,
                                           value_discretization_interval=discretization, sampling_prob=q)


def laplace_loss_width(noise_multiplier: float, q: float) -> Union[float, str]:
    """:attr:`PldRoute.loss_width` of the Poisson-sampled Laplace mechanism (sensitivity 1)."""
    max_loss = 1.0 / noise_multiplier
    if max_loss > _MAX_LAPLACE_LOSS:
        return f"Laplace loss 1/{noise_multiplier:g} overflows dp_accounting"
    return sampled_loss_range(q, max_loss)


def laplace_pld(noise_multiplier: float, q: float, discretization: float) -> Any:
    """dp_accounting's pessimistic PLD of the Poisson-sampled Laplace mechanism (add/remove)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: PLC0415 (slow import)

    return pld_lib.from_laplace_mechanism(noise_multiplier, pessimistic_estimate=True,
                                          value_discretization_interval=discretization, sampling_prob=q)


def pld_unavailable(mechanism: DpEvent) -> Optional[str]:
    """Why ``mechanism`` (a mechanism event) has no PLD at all, whatever its parameters and step count
    (None when its plugin registered a PLD route that applies to it)."""
    route = _PLD_ROUTES.get(type(mechanism))
    if route is None:
        return f"no PLD for {type(mechanism).__name__}"
    return route.unavailable(mechanism)


def pld_feasibility(event: DpEvent, count: int, discretization: float) -> Optional[str]:
    """Why the PLD route is not attempted for ``count`` x ``event`` (None when it is)."""
    if not isinstance(event, PoissonSampledEvent):
        return f"PLD route covers Poisson-sampled mechanisms only, not {type(event).__name__}"
    unavailable = pld_unavailable(event.event)
    if unavailable is not None:
        return unavailable
    width = _PLD_ROUTES[type(event.event)].loss_width(event.event, event.sampling_probability)
    if isinstance(width, str):
        return width
    if count > MAX_COMPOSITIONS:
        return f"{count} steps > {MAX_COMPOSITIONS} (PLD composition too costly)"
    points = width / discretization
    if points > MAX_GRID_POINTS:
        return f"single-step PLD grid of ~{points:.3g} points > {MAX_GRID_POINTS}"
    return None


def _single_step_pld(event: PoissonSampledEvent, discretization: float) -> Any:
    return _PLD_ROUTES[type(event.event)].single_step(event.event, event.sampling_probability, discretization)


def checked_pld(pld: Any, source: str) -> Any:
    """The single-step ``pld`` after checking each of its two PMFs (remove and add directions).

    Finite masses; negative masses only at rounding level; infinity mass in [0, 1]; total mass
    (infinity included) not below 1 (lost mass could hide privacy loss) and at most
    1 + 2e-6: dp_accounting's pessimistic add-direction PMF carries up to ~1e-8 extra mass
    (finer grids more), which can only raise delta(epsilon), i.e. stays conservative; the upper
    check catches gross failures only.
    """
    for direction in ("_pmf_remove", "_pmf_add"):
        pmf = getattr(pld, direction)
        probs = np.asarray(pmf.to_dense_pmf()._probs, dtype=float)  # noqa: SLF001 (no public accessor)
        infinity_mass = float(pmf._infinity_mass)  # noqa: SLF001
        total = float(probs.sum()) + infinity_mass
        # FFT composition leaves rounding-level negative masses (~1e-16); more is a failure.
        if not np.all(np.isfinite(probs)) or probs[probs < 0].sum() < -_MASS_TOLERANCE:
            raise InvalidPrivacyCurveError(f"{source}: PLD has NaN or negative mass; refusing to report an epsilon")
        excess_allowed = 2 * _EXCESS_MASS_PER_STEP
        if not 0.0 <= infinity_mass <= 1.0 + _MASS_TOLERANCE or not 1.0 - _MASS_TOLERANCE <= total <= 1.0 + excess_allowed:
            raise InvalidPrivacyCurveError(
                f"{source}: PLD masses are invalid ({direction[5:]} direction: total {total:.12g}, "
                f"infinity mass {infinity_mass:.3g}); refusing to report an epsilon"
            )
    return pld


class PldTooCostly(ArithmeticError):
    """The composed PLD would need a grid too large to compute in reasonable time."""


def composed_grid_points(step: Any, count: int, discretization: float) -> float:
    """Predicted grid size of ``count`` compositions of ``step``: the loss mean grows as count x mean,
    its spread as sqrt(count) x std; dp_accounting keeps about +-12 standard deviations."""
    widths = []
    for direction in ("_pmf_remove", "_pmf_add"):
        dense = getattr(step, direction).to_dense_pmf()
        probs = np.clip(np.asarray(dense._probs, dtype=float), 0.0, None)  # noqa: SLF001
        losses = (dense._lower_loss + np.arange(probs.size)) * discretization  # noqa: SLF001
        mass = probs.sum()
        mean = float(probs @ losses / mass)
        std = float(np.sqrt(max(probs @ (losses - mean) ** 2 / mass, 0.0)))
        widths.append(count * abs(mean) + 24.0 * math.sqrt(count) * std + probs.size * discretization)
    return max(widths) / discretization


@dataclass(frozen=True)
class BoundedPmf:
    """One direction of a composed PLD with a bound on its floating-point error.

    ``probs[i]`` is the computed mass at loss ``losses[i]`` (ascending); the exact composition of
    the computed single-step PMFs is within ``entry_error`` of it entry by entry; the true masses
    are at most ``1 + relative_error`` times that (single-step rounding); ``slack`` is mass of the
    exact composition that the computed PMF may not hold (the round-off of the entries that
    truncation moved at their computed value), counted as infinity mass.
    """

    losses: np.ndarray
    probs: np.ndarray
    infinity_mass: float
    entry_error: float
    relative_error: float
    slack: float

    def _loss_budget(self, delta: float) -> float:
        """The largest sum_{l > eps} (1 - e^{eps - l}) p(l), as computed, that still certifies ``delta``."""
        budget = delta / (1.0 + self.relative_error) - self.infinity_mass - self.slack
        return budget / (1.0 + summation_error_factor(4 * self.probs.size))

    def _computed_loss_sum(self, epsilon: float) -> float:
        start = int(np.searchsorted(self.losses, epsilon, side="right"))
        weights = -np.expm1(epsilon - self.losses[start:])
        return float(weights @ np.maximum(self.probs[start:] + self.entry_error, 0.0))

    def delta_upper_bound(self, epsilon: float) -> float:
        """A proven upper bound on the hockey-stick divergence at ``epsilon`` of the exact PLD."""
        loss_sum = self._computed_loss_sum(epsilon) * (1.0 + summation_error_factor(4 * self.probs.size))
        return (1.0 + self.relative_error) * (self.infinity_mass + self.slack + loss_sum)

    def epsilon_upper_bound(self, delta: float) -> float:
        """The smallest epsilon >= 0 (to rounding, never below) whose :meth:`delta_upper_bound` is <= ``delta``.

        Locates the grid cell with suffix sums without cancellation,
        S(l_j) = sum_{k > j} (1 - e^{-h}) (c_k + B_k), B_k = sum_{i > k} e^{-(l_i - l_k)} c_i
        (a decaying linear recurrence), solves S(l_j + t) = S(l_j) + E_j (1 - e^t), t in [-h, 0],
        in the cell, and certifies the result by direct evaluation.
        """
        from scipy.signal import lfilter  # noqa: PLC0415 (slow import: scipy.signal loads scipy.stats)

        budget = self._loss_budget(delta)
        if budget < 0:
            return math.inf
        masses = np.maximum(self.probs + self.entry_error, 0.0)
        if masses.size == 0 or self._computed_loss_sum(0.0) <= budget:
            return 0.0
        step = float(self.losses[1] - self.losses[0]) if masses.size > 1 else 1.0
        decay = math.exp(-step)
        # tail[k] = c_k + B_k = sum_{i >= k} e^{-(l_i - l_k)} c_i, computed from the top down.
        tail = lfilter([1.0], [1.0, -decay], masses[::-1])[::-1]
        # grid_sums[j] = S(l_j) = (1 - e^{-h}) sum_{k > j} tail[k]
        grid_sums = -math.expm1(-step) * np.concatenate([np.cumsum(tail[::-1])[::-1][1:], [0.0]])
        j = int(np.argmax(grid_sums <= budget))
        candidates = []
        if j > 0:
            # Aimed a hair below the budget, so that the rounding of the direct check cannot refuse it.
            gap = (budget * (1.0 - _CELL_SOLVE_MARGIN) - grid_sums[j]) / tail[j]
            candidates.append(float(self.losses[j]) + math.log1p(-min(max(gap, 0.0), -math.expm1(-step))))
        candidates += [float(loss) for loss in self.losses[j:j + 8]]
        for epsilon in candidates:
            epsilon = max(epsilon, 0.0)
            if self._computed_loss_sum(epsilon) <= budget:
                return epsilon
        return float(self.losses[-1])


@dataclass(frozen=True)
class ComposedPld:
    """A composed PLD (both directions) whose epsilon(delta) and delta(epsilon) are proven bounds."""

    directions: tuple[BoundedPmf, ...]

    def epsilon_for_delta(self, delta: float) -> float:
        return max(direction.epsilon_upper_bound(delta) for direction in self.directions)

    def delta_for_epsilon(self, epsilon: float) -> float:
        return max(direction.delta_upper_bound(epsilon) for direction in self.directions)


_DIRECTIONS = ("_pmf_remove", "_pmf_add")
_CELL_SOLVE_MARGIN = 1e-9
#: dp_accounting's default tail truncation of self_compose and compose (self_compose moves it to the
#: infinity mass; compose, pessimistic, moves its right tail there and its left tail to the lowest
#: entry kept; half of it per composition is charged for the rounding of those sums).
_TAIL_MASS_TRUNCATION = 1e-15


def _dense(pld: Any, direction: str) -> Any:
    return getattr(pld, direction).to_dense_pmf()


def _bounded_pmf(pld: Any, direction: str, entry_error: float, compositions: int, slack: float,
                 discretization: float) -> BoundedPmf:
    dense = _dense(pld, direction)
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001 (no public accessor)
    losses = (dense._lower_loss + np.arange(probs.size)) * discretization  # noqa: SLF001
    return BoundedPmf(losses, probs, float(dense._infinity_mass), entry_error,  # noqa: SLF001
                      composition_relative_error(compositions), slack)


def _check_within_error(bounded: BoundedPmf, source: str) -> None:
    """The composed masses are finite and no more negative than their round-off bound allows."""
    if not np.all(np.isfinite(bounded.probs)) or not math.isfinite(bounded.infinity_mass):
        raise InvalidPrivacyCurveError(f"{source}: PLD has NaN or infinite mass")
    if bounded.probs.size and float(bounded.probs.min()) < -bounded.entry_error:
        raise InvalidPrivacyCurveError(
            f"{source}: PLD has a mass of {float(bounded.probs.min()):.3g}, below its round-off bound "
            f"-{bounded.entry_error:.3g}")
    total = float(bounded.probs.sum()) + bounded.infinity_mass
    if total < 1.0 - _MASS_TOLERANCE - bounded.entry_error * bounded.probs.size:
        raise InvalidPrivacyCurveError(f"{source}: PLD lost mass (total {total:.12g})")


@lru_cache(maxsize=128)
def composed_pld(history: tuple[tuple[DpEvent, int], ...], discretization: float) -> ComposedPld:
    """The PLD of ``history`` (events with repetition counts), composed in order, with round-off bounds.

    Raises :class:`PldTooCostly` when a composition's predicted grid exceeds MAX_COMPOSED_POINTS and
    :class:`InvalidPrivacyCurveError` when a PLD is invalid (NaN, lost mass, or masses outside
    their round-off bounds).
    """
    total, errors, slack = None, {}, dict.fromkeys(_DIRECTIONS, 0.0)
    for event, count in history:
        step = checked_pld(_single_step_pld(event, discretization), f"PLD of {event}")
        points = composed_grid_points(step, count, discretization)
        if points > MAX_COMPOSED_POINTS:
            raise PldTooCostly(f"{count} steps need a PLD grid of ~{points:.3g} points > {MAX_COMPOSED_POINTS}")
        step_errors = {}
        for direction in _DIRECTIONS:
            if direction == "_pmf_add" and step._pmf_add is step._pmf_remove:  # noqa: SLF001 (symmetric: one PMF)
                step_errors[direction] = step_errors["_pmf_remove"]
                continue
            probs = np.asarray(_dense(step, direction)._probs, dtype=float)  # noqa: SLF001
            length = self_convolution_length(probs, count, _TAIL_MASS_TRUNCATION)
            step_errors[direction] = self_convolution_entry_error(probs, count, length)
        composed = step.self_compose(count, tail_mass_truncation=_TAIL_MASS_TRUNCATION) if count > 1 else step
        if total is None:
            total, errors = composed, step_errors
            continue
        full_sizes, later_masses = {}, {}
        for direction in _DIRECTIONS:
            earlier = np.asarray(_dense(total, direction)._probs, dtype=float)  # noqa: SLF001
            later = np.asarray(_dense(composed, direction)._probs, dtype=float)  # noqa: SLF001
            errors[direction] = convolution_entry_error(errors[direction], earlier, step_errors[direction], later)
            full_sizes[direction] = earlier.size + later.size - 1
            later_masses[direction] = (float(np.abs(later).sum()) + step_errors[direction] * later.size
                                       + float(_dense(composed, direction)._infinity_mass))  # noqa: SLF001
        total = total.compose(composed, tail_mass_truncation=_TAIL_MASS_TRUNCATION)
        for direction in _DIRECTIONS:
            # compose moves its truncated tails (to the infinity mass, and to the lowest entry kept) at
            # their computed masses: each truncated entry may hide its round-off bound.  Earlier slack
            # is extra mass of the earlier factor, scaled by the later factor's mass.
            truncated = full_sizes[direction] - _dense(total, direction).size
            slack[direction] = (slack[direction] * later_masses[direction] + errors[direction] * truncated
                                + _TAIL_MASS_TRUNCATION / 2)
    steps = sum(count for _, count in history)
    bounded = tuple(_bounded_pmf(total, direction, errors[direction], steps, slack[direction], discretization)
                    for direction in _DIRECTIONS)
    for direction in bounded:
        _check_within_error(direction, f"PLD of {steps} composed step(s)")
    return ComposedPld(bounded)


def history_infeasibility(history: tuple[tuple[DpEvent, int], ...], discretization: float) -> Optional[str]:
    """Why the PLD route cannot account ``history`` (None when it can)."""
    for event, count in history:
        reason = pld_feasibility(event, count, discretization)
        if reason is not None:
            return reason
    return None


def _discretizations(coarse_epsilon: float) -> list[float]:
    fine = max(coarse_epsilon / REFINEMENT, FINEST_DISCRETIZATION)
    return [COARSE_DISCRETIZATION] if fine > 0.5 * COARSE_DISCRETIZATION else [COARSE_DISCRETIZATION, fine]


@lru_cache(maxsize=1024)
def pld_epsilon(
    history: tuple[tuple[DpEvent, int], ...], delta: float, refine: bool = True
) -> tuple[float, Optional[str]]:
    """(epsilon(delta), None), or (+inf, reason) when the PLD route does not apply or cannot certify ``delta``.

    Two passes: a coarse value grid, then (``refine``), for small epsilons, a grid of about
    epsilon / 3000; both are pessimistic and carry their round-off bound, so the smaller result
    is reported.  A PLD that cannot be built (dp_accounting's numerics fail, or its masses break
    their checks) gives +inf with the reason: the default accountants then answer by RDP.
    """
    reason = history_infeasibility(history, COARSE_DISCRETIZATION)
    if reason is not None:
        return math.inf, reason
    try:
        coarse = composed_pld(history, COARSE_DISCRETIZATION).epsilon_for_delta(delta)
        best = coarse
        if refine and math.isfinite(coarse):
            for discretization in _discretizations(coarse)[1:]:
                if history_infeasibility(history, discretization) is None:
                    best = min(best, composed_pld(history, discretization).epsilon_for_delta(delta))
    except PldTooCostly as err:
        return math.inf, str(err)
    except (ArithmeticError, ValueError) as err:  # dp_accounting's numerics or our checks gave up
        return math.inf, f"PLD not valid ({type(err).__name__}: {err})"
    if not math.isfinite(best):
        return math.inf, f"round-off bound of the composed PLD exceeds delta = {delta:g}"
    return best, None


@lru_cache(maxsize=1024)
def pld_delta(history: tuple[tuple[DpEvent, int], ...], epsilon: float) -> tuple[float, Optional[str]]:
    """(delta(epsilon), None) on the coarse grid, round-off included, or (1.0, reason) when the PLD
    route does not apply."""
    reason = history_infeasibility(history, COARSE_DISCRETIZATION)
    if reason is not None:
        return 1.0, reason
    try:
        return min(1.0, composed_pld(history, COARSE_DISCRETIZATION).delta_for_epsilon(epsilon)), None
    except PldTooCostly as err:
        return 1.0, str(err)
    except (ArithmeticError, ValueError) as err:
        return 1.0, f"PLD not valid ({type(err).__name__}: {err})"
