"""Calibrating a noise parameter to a target (epsilon, delta).

Every calibrator returns a value whose epsilon is checked, after solving, to be <= the target
(never overshoots), and raises :class:`UnreachableTargetError` naming the floor when no value
of the parameter reaches the target.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dpnoise.accounting.accountant import (
    Ledger,
    UnsoundAccountantWarning,
    accountant_holding,
    epsilon_of_events,
    flat_ledger,
)
from dpnoise.accounting.adaptive_clipping import CountEvent, adaptive_step_event
from dpnoise.accounting.events import DpEvent, PoissonSampledEvent
from dpnoise.accounting.mechanisms import MechanismOptions, NoOptions, RunFacts, get_mechanism_spec
from dpnoise.accounting.rdp.curve import InvalidPrivacyCurveError
from dpnoise.accounting.registry import accountants_for_mechanism, get_spec
from dpnoise.accounting.solvers import (
    UnreachableTargetError,
    solve_by_secant,
    solve_ratio,
    solve_smallest,
)
from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_count,
    check_delta,
    check_positive,
    check_sample_rate,
)

#: the most steps accounted: beyond, step counts are no longer exact integers in floating point
MAX_STEPS = 2**53 - 1


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
    #: the mechanism's side parameters the epsilon was computed with (e.g. the Dirichlet alpha and number of
    #: classes)
    options: MechanismOptions = NoOptions()
    epsilon_by_accountant: dict[str, float] = field(default_factory=dict)
    initial_guess: Optional[float] = None

    @property
    def noise_keyword(self) -> str:
        return get_mechanism_spec(self.mechanism).noise.keyword

    def noise_arguments(self) -> dict[str, float]:
        return {self.noise_keyword: self.noise}


#: noise in the mechanism's unit -> the DP event of one training step: what the calibrators search
StepEventFactory = Callable[[float], DpEvent]


def step_event_factory(mechanism: str, sample_rate: float, *, facts: RunFacts = RunFacts(),
                       options: Optional[MechanismOptions] = None,
                       count_release: Optional[CountEvent] = None) -> StepEventFactory:
    """``noise -> PoissonSampledEvent(sample_rate, the mechanism's event at that noise)`` for a run with
    these facts and options (:meth:`~dpnoise.accounting.mechanisms.MechanismSpec.build_event`, checked once
    here); with ``count_release`` (adaptive clipping's noisy count, a fixed noise), the step releases both on
    the same subsample (:func:`~dpnoise.accounting.adaptive_clipping.adaptive_step_event`)."""
    spec = get_mechanism_spec(mechanism)
    q = check_sample_rate("sample_rate", sample_rate)
    options = spec.make_options(options)
    spec.build_event(1.0, options, facts)  # refuses facts the mechanism cannot use (lap2 without params)

    def step_event(noise: float) -> DpEvent:
        gradient = spec.build_event(noise, options, facts)
        return PoissonSampledEvent(q, gradient) if count_release is None else \
            adaptive_step_event(q, gradient, count_release)

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
    options: Optional[MechanismOptions] = None,
    count_release: Optional[CountEvent] = None,
) -> CalibrationResult:
    """Smallest noise reaching the target, in the mechanism's unit (:attr:`CalibrationResult.noise_keyword`).

    ``count_release``: adaptive clipping's noisy count, released with every step's gradient sum (its noise
    given): the gradient noise is calibrated so that the steps releasing both meet the target.

    ``options``: the mechanism's side parameters (default: theirs).
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
    options = get_mechanism_spec(spec.mechanism).make_options(options)
    step_event = step_event_factory(spec.mechanism, q, facts=RunFacts(clip=clip, params=params), options=options,
                                    count_release=count_release)
    if releases:
        spent = epsilon_at_noise(accountant, step_event, 1.0, 0, delta, releases)  # no step
        if spent >= eps_t:
            raise UnreachableTargetError(f"epsilon={eps_t:g} is unreachable: the releases before training alone "
                                         f"cost epsilon={spent:.4g} under {accountant} (delta={delta:g})")
    scale = _noise_scale(accountant, clip)
    guess = gaussian_initial_noise(eps_t, delta, q, steps)
    ratio = solve_ratio(_StepsSearch(step_event, scale, steps, releases, eps_t, delta), accountant, max(guess, 1e-3))
    noise = ratio * scale
    by_acc = {
        name: epsilon_at_noise(name, step_event, noise, steps, delta, releases)
        for name in dict.fromkeys([accountant, *(accountants_for_mechanism(spec.mechanism) if compare else [])])
    }
    if by_acc[accountant] > eps_t:  # every route checks its answer; this guards the combination
        raise InvalidPrivacyCurveError(f"calibration of {accountant} gave epsilon {by_acc[accountant]} > {eps_t}")
    return CalibrationResult(
        spec.mechanism, accountant, noise, by_acc[accountant], delta, q, steps, clip, params, options,
        epsilon_by_accountant=by_acc, initial_guess=guess * scale,
    )


@dataclass(frozen=True)
class _StepsSearch:
    """The search of :func:`calibrate_noise` (a :class:`~dpnoise.accounting.kinds.NoiseRatioSearch`): noise
    ratio r -> ``releases``, then ``steps`` x ``step_event(r * scale)`` (scale: C where the privacy depends on
    noise / C only, else 1)."""

    step_event: StepEventFactory
    scale: float
    steps: int
    releases: tuple[DpEvent, ...]
    target: float
    delta: float

    def epsilon(self, accountant: str, ratio: float) -> float:
        return epsilon_at_noise(accountant, self.step_event, ratio * self.scale, self.steps, self.delta, self.releases)

    def ledger(self, accountant: str, ratio: float) -> Ledger:
        held = accountant_holding(accountant, self.releases).compose(self.step_event(ratio * self.scale), self.steps)
        return flat_ledger(held.history)


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
    options: Optional[MechanismOptions] = None,
    releases: Sequence[DpEvent] = (),
    count_release: Optional[CountEvent] = None,
    **option_fields: Any,
) -> CalibrationResult:
    """The noise of ``accountant``'s mechanism reaching (target_epsilon, delta) after ``steps`` steps,
    by the mechanism's own calibrator where its spec has one (the Dirichlet r), else
    :func:`calibrate_noise`.  The mechanism's side parameters are ``options`` or its fields as keywords
    (``alpha=``, ``num_classes=``), refused by a mechanism that does not take them; ``releases`` (events
    before the steps) and ``count_release`` (adaptive clipping's count, :func:`calibrate_noise`) by one with its
    own calibrator."""
    mechanism = get_mechanism_spec(get_spec(accountant).mechanism)
    options = mechanism.make_options(options, **option_fields)
    facts = RunFacts(clip=clip, params=params)
    mechanism.build_event(1.0, options, facts)  # refuses facts the mechanism cannot use (lap2 without params)
    if mechanism.calibrate is None:
        return calibrate_noise(accountant, target_epsilon, delta, sample_rate, steps, clip=clip, params=params,
                               releases=releases, options=options, count_release=count_release)
    if releases or count_release is not None:
        raise InvalidParameterError(f"releases before training and adaptive clipping's count are not accounted "
                                    f"for mechanism {mechanism.name!r}")
    return mechanism.calibrate(accountant, target_epsilon, delta, sample_rate, steps, options)


# the root finders and their error live in solvers; calibrators import them from here too
__all__ = [
    "MAX_STEPS",
    "CalibrationResult",
    "StepEventFactory",
    "UnreachableTargetError",
    "calibrate",
    "calibrate_noise",
    "clip_from_gradient_norms",
    "epsilon_at_noise",
    "gaussian_initial_noise",
    "solve_by_secant",
    "solve_smallest",
    "step_event_factory",
    "steps_from_epochs",
    "validated_target",
]
