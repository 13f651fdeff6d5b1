"""Declarative DP events: *what happened*, separate from *how it is accounted*.

Modelled on dp_accounting's ``dp_event`` module; :func:`to_dp_accounting` converts the events that
exist there too (Gaussian, Laplace, Poisson sampling, composition) for cross-checks.
All noise parameters are normalised by the sensitivity (clipping norm).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from numbers import Integral, Real
from typing import Any, Optional, Union

from dpnoise.accounting.validation import (
    InvalidParameterError,
    check_count,
    check_positive,
    check_sample_rate,
)


@dataclass(frozen=True)
class GaussianEvent:
    """Gaussian noise of std ``noise_multiplier * C`` on a sum with L2 sensitivity C."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class LaplaceEvent:
    """i.i.d. Laplace(b) noise on a sum with L1 sensitivity C; ``noise_multiplier = b / C``."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class Lap2Event:
    """i.i.d. Laplace(b) noise on each of ``num_params`` coordinates of a sum with L2 sensitivity C."""

    noise_multiplier: float
    num_params: int

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "num_params", check_count("num_params", self.num_params, 1))


@dataclass(frozen=True)
class DirichletEvent:
    """One release of p~ ~ Dir(r s + alpha) per selected example (inputs private, labels public).

    ``num_classes``: the number d of classes (the length of s), or None where it is not recorded.
    The RDP routes hold for every d; the two-class PLD route (docs/theory/dirichlet.md Sec. 1.3)
    applies only to an event that records d = 2.
    """

    r: float
    alpha: float
    num_classes: Optional[int] = None

    def __post_init__(self) -> None:
        check_positive("r", self.r)
        check_positive("alpha", self.alpha)
        if self.num_classes is not None:
            if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, Integral):
                raise InvalidParameterError(f"num_classes must be an integer >= 2 or None, got {self.num_classes!r}")
            object.__setattr__(self, "num_classes", check_count("num_classes", self.num_classes, 2))


@dataclass(frozen=True)
class PoissonSampledEvent:
    """``event`` applied to a Poisson subsample with inclusion probability ``sampling_probability``."""

    sampling_probability: float
    event: "DpEvent"

    def __post_init__(self) -> None:
        check_sample_rate("sampling_probability", self.sampling_probability)


@dataclass(frozen=True)
class SelfComposedEvent:
    """``event`` repeated ``count`` times (adaptive composition)."""

    event: "DpEvent"
    count: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", check_count("count", self.count, 0))


@dataclass(frozen=True)
class ComposedEvent:
    """Several events composed."""

    events: tuple["DpEvent", ...]


@dataclass(frozen=True)
class DiscreteGaussianStepEvent:
    """``event`` (a step of Gaussian noise on a sum) released as secure mode releases it: the sum rounded to
    a grid by randomized rounding of width ``smoothing`` grid steps and exact discrete Gaussian noise on
    each of its ``coordinates`` coordinates (:mod:`dpnoise.mechanisms.secure_noise`).

    Like dp_accounting's ``DiscreteGaussianDpEvent``, which carries its dimension, the event carries what
    its accounting needs: every accountant accounts ``event`` (the continuous step the release
    approximates) and then corrects the whole ledger once (:mod:`dpnoise.accounting.secure_noise`,
    :func:`~dpnoise.accounting.secure_noise.discrete_log_ratio`; Canonne, Kamath & Steinke,
    arXiv 2004.00010; docs/theory/secure_noise.md §3.3)."""

    event: "DpEvent"
    coordinates: int
    smoothing: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "coordinates", check_count("coordinates", self.coordinates, 1))
        object.__setattr__(self, "smoothing", check_count("smoothing", self.smoothing, 1))


@dataclass(frozen=True)
class RepeatAndSelectEvent:
    """``event`` (one trial: e.g. a whole training run) repeated a random number K of times, only the best
    trial released (private hyperparameter tuning; Papernot & Steinke, arXiv 2110.03620, as dp_accounting's
    ``RepeatAndSelectDpEvent``).  E[K] = ``mean``; ``shape``: K's law, the truncated negative binomial's
    eta >= 0 (0: logarithmic, 1: geometric) or ``inf``: Poisson."""

    event: "DpEvent"
    mean: float
    shape: float

    def __post_init__(self) -> None:
        if isinstance(self.mean, bool) or not isinstance(self.mean, Real) or not math.isfinite(self.mean) \
                or self.mean < 1:
            raise InvalidParameterError(f"mean (the expected number of trials) must be finite and >= 1, got "
                                        f"{self.mean!r}")
        if isinstance(self.shape, bool) or not isinstance(self.shape, Real) or math.isnan(self.shape) or self.shape < 0:
            raise InvalidParameterError(f"shape must be >= 0 (inf: Poisson), got {self.shape!r}")
        object.__setattr__(self, "mean", float(self.mean))
        object.__setattr__(self, "shape", float(self.shape))


MechanismEvent = Union[GaussianEvent, LaplaceEvent, Lap2Event, DirichletEvent]
DpEvent = Union[MechanismEvent, PoissonSampledEvent, SelfComposedEvent, ComposedEvent, DiscreteGaussianStepEvent,
                RepeatAndSelectEvent]

#: every event class by name (what :func:`event_from_dict` can build): the compositions and the discrete step
#: here, each mechanism's event added by its plugin (:func:`register_event_type`)
EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (PoissonSampledEvent, SelfComposedEvent, ComposedEvent,
                                                              DiscreteGaussianStepEvent, RepeatAndSelectEvent)}


def register_event_type(event_type: type) -> type:
    """Make ``event_type`` (a frozen dataclass) known to :func:`event_from_dict` by its class name;
    registering the same class again is a no-op, another class of the same name is refused."""
    known = EVENT_TYPES.get(event_type.__name__)
    if known is not None and known is not event_type:
        raise InvalidParameterError(f"another DP event type named {event_type.__name__!r} is already registered")
    EVENT_TYPES[event_type.__name__] = event_type
    return event_type


def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """A JSON-able description of ``event`` (``{"type": ..., fields...}``); an optional field at its
    default (e.g. a Dirichlet event's unrecorded ``num_classes``) is left out, so that the description
    is the one written before that field existed."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for f in fields(event):
        value = getattr(event, f.name)
        if f.default is not MISSING and value == f.default:
            continue
        if f.name == "event":
            value = event_to_dict(value)
        elif f.name == "events":
            value = [event_to_dict(e) for e in value]
        out[f.name] = value
    return out


def event_from_dict(data: dict[str, Any]) -> DpEvent:
    """Inverse of :func:`event_to_dict`; :class:`InvalidParameterError` for anything it would not write
    (not a dictionary, an unknown type, missing or unknown fields, values outside their domain).
    Optional fields may be missing (they take their default)."""
    if not isinstance(data, dict):
        raise InvalidParameterError(f"a DP event must be a dictionary with a 'type', got {data!r}")
    data = dict(data)
    kind = data.pop("type", None)
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise InvalidParameterError(f"unknown DP event type {kind!r}; choose from {', '.join(EVENT_TYPES)}")
    expected = {f.name for f in fields(EVENT_TYPES[kind])}
    required = {f.name for f in fields(EVENT_TYPES[kind]) if f.default is MISSING}
    if not required <= set(data) <= expected:
        optional = f" (optional: {', '.join(sorted(expected - required))})" if expected != required else ""
        raise InvalidParameterError(f"DP event {kind} has the fields {', '.join(sorted(expected))}{optional}, "
                                    f"got {', '.join(sorted(map(str, data))) or 'none'}")
    if "event" in data:
        data["event"] = event_from_dict(data["event"])
    if "events" in data:
        if not isinstance(data["events"], (list, tuple)):
            raise InvalidParameterError(f"DP event {kind}: events must be a list of DP events, got {data['events']!r}")
        data["events"] = tuple(event_from_dict(e) for e in data["events"])
    return EVENT_TYPES[kind](**data)


def to_dp_accounting(event: DpEvent) -> Any:
    """The equivalent ``dp_accounting`` event (Gaussian, Laplace, sampling and composition only).

    Raises ``NotImplementedError`` for Lap2 and Dirichlet, which dp_accounting does not model.
    Requires the ``dp-accounting`` package.
    """
    import dp_accounting  # noqa: PLC0415  (optional dependency)

    if isinstance(event, GaussianEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, LaplaceEvent):
        return dp_accounting.LaplaceDpEvent(event.noise_multiplier)
    if isinstance(event, PoissonSampledEvent):
        return dp_accounting.PoissonSampledDpEvent(
            event.sampling_probability, to_dp_accounting(event.event)
        )
    if isinstance(event, SelfComposedEvent):
        return dp_accounting.SelfComposedDpEvent(to_dp_accounting(event.event), event.count)
    if isinstance(event, ComposedEvent):
        return dp_accounting.ComposedDpEvent([to_dp_accounting(e) for e in event.events])
    if isinstance(event, RepeatAndSelectEvent):
        return dp_accounting.dp_event.RepeatAndSelectDpEvent(to_dp_accounting(event.event), event.mean, event.shape)
    raise NotImplementedError(f"dp_accounting has no equivalent of {type(event).__name__}")


__all__ = [
    "GaussianEvent",
    "LaplaceEvent",
    "Lap2Event",
    "DirichletEvent",
    "PoissonSampledEvent",
    "SelfComposedEvent",
    "ComposedEvent",
    "DiscreteGaussianStepEvent",
    "RepeatAndSelectEvent",
    "DpEvent",
    "EVENT_TYPES",
    "register_event_type",
    "event_to_dict",
    "event_from_dict",
    "to_dp_accounting",
]
