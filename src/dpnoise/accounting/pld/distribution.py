"""Our DP events as privacy loss distributions (PLDs) of dp_accounting, with pessimistic rounding.

dp_accounting (Google, https://github.com/google/differential-privacy, ``dp_accounting.pld``)
builds the PLD of the Poisson-sampled Gaussian and Laplace mechanisms under add/remove adjacency
with "connect the dots" pessimistic discretisation (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi,
"Connect the dots: tighter discrete approximations of privacy loss distributions",
arXiv 2207.04380): every epsilon(delta) it returns is an upper bound on the true one.

* Gaussian and penultimate-gaussian: ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``;
* Laplace with L1 clipping: ``PoissonSampledDpEvent(q, LaplaceDpEvent(b / C))`` (the worst case of
  the L1 ball is a one-coordinate shift of C);
* Lap2: no PLD of its own; one step is M_n-GDP (:func:`~dpnoise.accounting.pld.gdp.lap2_gdp_mu`),
  GDP dominating pairs survive Poisson subsampling and composition (Zhu, Dong & Wang, "Optimal
  accounting of differential privacy via characteristic function", arXiv 2106.08567), so the PLD
  of the Poisson-sampled Gaussian with noise multiplier 1/M_n bounds it.

The PLD route is only attempted where its grid stays small (:func:`pld_feasibility`); elsewhere
it reports "not computed" and the accountant falls back on its RDP route.  Every PLD is checked
(mass at most 1, infinity mass in [0, 1], no NaN) before it gives an epsilon.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from dpnoise.accounting.events import (
    DpEvent,
    GaussianEvent,
    Lap2Event,
    LaplaceEvent,
    PoissonSampledEvent,
)
from dpnoise.accounting.pld.gdp import lap2_gdp_mu
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError

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


def gaussian_noise_multiplier(event: DpEvent) -> Optional[float]:
    """The sensitivity-1 Gaussian noise multiplier whose PLD bounds ``event``'s (None if none)."""
    if isinstance(event, GaussianEvent):
        return event.noise_multiplier
    if isinstance(event, Lap2Event):
        mu = lap2_gdp_mu(event.noise_multiplier, event.num_params)
        return 1.0 / mu if mu > 0 else math.inf
    return None


def _sampled_loss_range(q: float, max_loss: float) -> float:
    """Width of the privacy-loss support of a q-sampled mechanism whose loss is at most ``max_loss``.

    Sampling maps a loss L to log(1 - q + q e^L) (and its negative in the other direction).
    """
    return 2.0 * float(np.logaddexp(np.log1p(-q), np.log(q) + max_loss)) if q < 1 else 2.0 * max_loss


def pld_feasibility(event: DpEvent, count: int, discretization: float) -> Optional[str]:
    """Why the PLD route is not attempted for ``count`` x ``event`` (None when it is)."""
    if not isinstance(event, PoissonSampledEvent):
        return f"PLD route covers Poisson-sampled mechanisms only, not {type(event).__name__}"
    mechanism = event.event
    sigma = gaussian_noise_multiplier(mechanism)
    if sigma is not None:
        if not 1e-100 < sigma < 1e100:  # dp_accounting squares sigma
            return f"noise multiplier {sigma:g} out of the PLD route's range"
        # dp_accounting truncates the Gaussian at |x| <= 10 sigma: loss up to 10/sigma + 1/(2 sigma^2).
        max_loss = _GAUSSIAN_TAIL / sigma + 0.5 / sigma / sigma
    elif isinstance(mechanism, LaplaceEvent):
        max_loss = 1.0 / mechanism.noise_multiplier
        if max_loss > _MAX_LAPLACE_LOSS:
            return f"Laplace loss 1/{mechanism.noise_multiplier:g} overflows dp_accounting"
    else:
        return f"no PLD for {type(mechanism).__name__}"
    if count > MAX_COMPOSITIONS:
        return f"{count} steps > {MAX_COMPOSITIONS} (PLD composition too costly)"
    points = _sampled_loss_range(event.sampling_probability, max_loss) / discretization
    if points > MAX_GRID_POINTS:
        return f"single-step PLD grid of ~{points:.3g} points > {MAX_GRID_POINTS}"
    return None


def _single_step_pld(event: PoissonSampledEvent, discretization: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: PLC0415 (slow import)

    q = event.sampling_probability
    sigma = gaussian_noise_multiplier(event.event)
    if sigma is not None:
        return pld_lib.from_gaussian_mechanism(
            sigma, pessimistic_estimate=True, value_discretization_interval=discretization, sampling_prob=q
        )
    return pld_lib.from_laplace_mechanism(
        event.event.noise_multiplier, pessimistic_estimate=True,
        value_discretization_interval=discretization, sampling_prob=q,
    )


def checked_pld(pld: Any, source: str, compositions: int = 1) -> Any:
    """``pld`` after checking each of its two PMFs (remove and add directions).

    Finite masses; negative masses only at rounding level; infinity mass in [0, 1]; total mass
    (infinity included) not below 1 (lost mass could hide privacy loss) and at most
    1 + 1e-6 per composition: dp_accounting's pessimistic add-direction PMF carries up to ~1e-8
    extra mass per step (finer grids more), which can only raise delta(epsilon), i.e. stays
    conservative; the upper check catches gross failures only.
    """
    for direction in ("_pmf_remove", "_pmf_add"):
        pmf = getattr(pld, direction)
        probs = np.asarray(pmf.to_dense_pmf()._probs, dtype=float)  # noqa: SLF001 (no public accessor)
        infinity_mass = float(pmf._infinity_mass)  # noqa: SLF001
        total = float(probs.sum()) + infinity_mass
        # FFT composition leaves rounding-level negative masses (~1e-16); more is a failure.
        if not np.all(np.isfinite(probs)) or probs[probs < 0].sum() < -_MASS_TOLERANCE:
            raise InvalidPrivacyCurveError(f"{source}: PLD has NaN or negative mass; refusing to report an epsilon")
        excess_allowed = _EXCESS_MASS_PER_STEP * (1 + compositions)
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


@lru_cache(maxsize=128)
def composed_pld(history: tuple[tuple[DpEvent, int], ...], discretization: float) -> Any:
    """The checked PLD of ``history`` (events with repetition counts), composed in order.

    Raises :class:`PldTooCostly` when a composition's predicted grid exceeds MAX_COMPOSED_POINTS.
    """
    total = None
    for event, count in history:
        step = checked_pld(_single_step_pld(event, discretization), f"PLD of {event}")
        points = composed_grid_points(step, count, discretization)
        if points > MAX_COMPOSED_POINTS:
            raise PldTooCostly(f"{count} steps need a PLD grid of ~{points:.3g} points > {MAX_COMPOSED_POINTS}")
        composed = step.self_compose(count) if count > 1 else step
        total = composed if total is None else total.compose(composed)
    steps = sum(count for _, count in history)
    return checked_pld(total, f"PLD of {steps} composed step(s)", compositions=steps)


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
    """(epsilon(delta), None), or (+inf, reason) when the PLD route does not apply.

    Two passes: a coarse value grid, then (``refine``), for small epsilons, a grid of about
    epsilon / 3000; both are pessimistic, so the smaller result is reported.
    """
    reason = history_infeasibility(history, COARSE_DISCRETIZATION)
    if reason is not None:
        return math.inf, reason
    try:
        best = math.inf
        coarse = _coarse_epsilon(history, delta)
        for discretization in _discretizations(coarse) if refine else [COARSE_DISCRETIZATION]:
            if history_infeasibility(history, discretization) is None:
                best = min(best, float(composed_pld(history, discretization).get_epsilon_for_delta(delta)))
    except PldTooCostly as err:
        return math.inf, str(err)
    except (ArithmeticError, ValueError) as err:  # dp_accounting's own numerics gave up
        if isinstance(err, InvalidPrivacyCurveError):
            raise
        return math.inf, f"dp_accounting failed ({type(err).__name__}: {err})"
    return max(best, 0.0), None


def _coarse_epsilon(history: tuple[tuple[DpEvent, int], ...], delta: float) -> float:
    return float(composed_pld(history, COARSE_DISCRETIZATION).get_epsilon_for_delta(delta))


@lru_cache(maxsize=1024)
def pld_delta(history: tuple[tuple[DpEvent, int], ...], epsilon: float) -> tuple[float, Optional[str]]:
    """(delta(epsilon), None) on the coarse grid, or (1.0, reason) when the PLD route does not apply."""
    reason = history_infeasibility(history, COARSE_DISCRETIZATION)
    if reason is not None:
        return 1.0, reason
    return min(1.0, float(composed_pld(history, COARSE_DISCRETIZATION).get_delta_for_epsilon(epsilon))), None
