"""The mechanism registry: what each mechanism is (torch-free).

One :class:`MechanismSpec` per mechanism states its noise parameter and unit, what it perturbs,
its per-step DP event, its accountants (the sound default first), the worst-case pair of the
exact lower-bound audit, how its noise is calibrated and what its epsilon covers.  Each built-in
mechanism is one module of :mod:`dpnoise.accounting.plugins` that registers its spec together with
its RDP and PLD routes and its accountants (:func:`dpnoise.accounting.plugin.register_plugin`); the
command line's ``--mechanism`` and ``--accountant`` choices, the accountants, the calibrators, the
audits and the training engine all read this registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Optional, Union, get_args, get_origin, get_type_hints

from dpnoise.accounting.events import MechanismEvent
from dpnoise.accounting.validation import (
    ACCOUNTED_RANGE,
    InvalidParameterError,
    check_accounted,
    check_count,
    check_noise_per_clip,
    check_positive,
)
from dpnoise.formatting import significant_digits

#: Printed next to every Dirichlet / penultimate-layer epsilon (docs/theory/dirichlet.md Sec. 5).
OUTPUT_PRIVACY_SCOPE = (
    "Scope: this epsilon bounds what the released noisy outputs reveal about the private inputs "
    "(labels are public). It is NOT a guarantee for the trained model's parameters: the SGD "
    "update is not a post-processing of the released outputs, since it depends on the private "
    "input through the network's Jacobian, and over several training steps the same dependence "
    "reaches the later outputs of the other examples, which the accountant does not charge "
    "(docs/theory/dirichlet.md Sec. 5)."
)


@dataclass(frozen=True)
class NoiseParameter:
    """How a mechanism's noise is given: its keyword in the Python API and its unit.

    ``per_clip``: the mechanism's privacy depends on the noise only through noise / C (an
    absolute scale, e.g. the Laplace b); otherwise the noise is already relative to C (the noise
    multiplier sigma) or does not involve C (the Dirichlet r).
    ``larger_is_more_private``: more noise is a larger value (sigma, b), or a smaller one (r).
    """

    keyword: str
    unit: str
    per_clip: bool
    larger_is_more_private: bool = True
    #: the values (per clip where ``per_clip``) the accountants compute with without overflowing
    limits: tuple[float, float] = ACCOUNTED_RANGE

    def printed(self, value: float, digits: int = 6) -> str:
        """``value`` to ``digits`` significant digits, rounded toward more privacy (sigma and b up, r
        down), so that the printed noise fed back never gives more than the epsilon it was calibrated to."""
        return significant_digits(value, digits, "up" if self.larger_is_more_private else "down")


NOISE_MULTIPLIER = NoiseParameter(
    "noise_multiplier", "noise multiplier sigma: the noise std is sigma * C", per_clip=False,
    limits=(0.0, math.inf))  # the Gaussian routes take any sigma
LAPLACE_SCALE = NoiseParameter(
    "laplace_scale", "absolute Laplace scale b per coordinate (privacy depends on b / C)", per_clip=True)
CONCENTRATION = NoiseParameter(
    "concentration", "Dirichlet concentration r of Dir(r softmax + alpha): smaller r is more private",
    per_clip=False, larger_is_more_private=False)


def side_option(default: Any, *, help: str, flag: Optional[str] = None) -> Any:
    """A field of a :class:`MechanismOptions` dataclass: its default, its help and its command-line flag
    (default: ``--`` and the field's name with dashes), from which the commands generate the flag."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True, kw_only=True)
class MechanismOptions:
    """A mechanism's side parameters besides its noise (e.g. the Dirichlet offset alpha), declared by its
    plugin as a frozen keyword-only subclass whose fields are :func:`side_option` s and whose
    ``__post_init__`` checks them (errors name the field).  Built by :meth:`MechanismSpec.make_options`
    from keywords, flags or a configuration; serialised by :meth:`to_dict`."""

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (what a checkpoint, a result or a record stores)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class NoOptions(MechanismOptions):
    """The options of a mechanism without side parameters."""


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What a run knows besides the noise and the mechanism's options, checked when built: the clipping
    norm C (finite, > 0) and the number of trained parameters n (an integer >= 1; None: not given).
    Both describe every run, also where an event does not depend on them (only Lap2 uses n)."""

    clip: float = 1.0
    params: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip", check_positive("clip", self.clip))
        if self.params is not None:
            object.__setattr__(self, "params", check_count("params", self.params, 1))


#: (noise in the mechanism's unit, its options, the run's facts) -> the per-step event
EventFactory = Callable[[float, Any, RunFacts], MechanismEvent]


@dataclass(frozen=True)
class AuditPair:
    """The worst-case neighbouring pair of :func:`dpnoise.audit.pld.lower_bound`.

    ``family``: a pair family of :data:`dpnoise.audit.pld.PAIR_FAMILIES`, e.g. "gaussian-shift",
    "laplace-shift" (a one-coordinate shift of C), "laplace-spread" (the shifts
    (C / sqrt(k))(1,..,1,0,..) over k, for L2 clipping with i.i.d. Laplace noise) or
    "dirichlet-vertex"; the pair is read off the mechanism's per-step event, whose noise is relative to
    the sensitivity (the penultimate-layer Gaussian's event is already at sigma / 2: a clipped activation
    moves by up to 2C).
    """

    family: str


@dataclass(frozen=True)
class MechanismSpec:
    """What one mechanism is: noise, what it perturbs, how it is accounted, audited, calibrated."""

    name: str
    description: str
    noise: NoiseParameter
    #: "gradients": the sum of clipped per-example gradients is perturbed (per-sample gradients
    #: needed); "outputs": each example's model output is perturbed (no per-sample gradients).
    perturbs: Literal["gradients", "outputs"]
    #: "gaussian", "laplace" or "dirichlet": the law of the noise.
    noise_distribution: Literal["gaussian", "laplace", "dirichlet"]
    event: EventFactory
    #: the class of the events ``event`` builds
    event_type: type
    #: accountants reported side by side, the sound default first (names in ``ACCOUNTANTS``)
    accountants: tuple[str, ...]
    audit_pair: AuditPair
    #: per-example clipping norm order (2 or 1) of a gradient mechanism's clipping (None: outputs)
    clip_norm_ord: Optional[int] = None
    #: the event needs the number of trained parameters n (Lap2)
    needs_params: bool = False
    #: the class of its side parameters (:class:`MechanismOptions`; e.g. the Dirichlet offset alpha and the
    #: number of classes)
    options: type = NoOptions
    #: what the epsilon covers when it is not the trained model (output mechanisms)
    scope: Optional[str] = None
    #: secure mode's exact integer noise for this mechanism (docs/theory/secure_noise.md); None: no
    #: secure mode (the output mechanisms draw their noise in the model's forward pass)
    secure_noise: Optional[Literal["discrete-gaussian", "discrete-laplace"]] = None
    #: the calibrator of a mechanism whose noise is not searched as sigma or b / C
    #: (``calibrate(accountant, target_epsilon, delta, sample_rate, steps, options)``, the Dirichlet r in
    #: (0, alpha)); None: :func:`dpnoise.accounting.calibrate_noise`
    calibrate: Optional[Callable[..., Any]] = None
    #: the learning rate may be given as an effective one, lr x kappa(r, alpha) (the Dirichlet
    #: mechanism's gradient scale, docs/theory/dirichlet.md Sec. 4)
    effective_lr: bool = False

    @property
    def default_accountant(self) -> str:
        return self.accountants[0]

    @property
    def needs_per_sample_gradients(self) -> bool:
        return self.perturbs == "gradients"

    def check_noise(self, noise: object, clip: object = 1.0, *, noise_name: Optional[str] = None,
                    clip_name: str = "clip") -> float:
        """``noise`` (in :attr:`noise`'s unit) after checking that what the accountants compute with is
        within :attr:`NoiseParameter.limits`: the noise itself, or its ratio to ``clip`` where the privacy
        depends on that (:attr:`NoiseParameter.per_clip`).  The errors name
        them ``noise_name`` (default: the noise's keyword) and ``clip_name``, as the caller's user gave them."""
        name, limits = noise_name or self.noise.keyword, self.noise.limits
        if self.noise.per_clip:
            check_noise_per_clip(name, noise, clip_name, clip, limits)
            return float(noise)
        return check_accounted(name, noise, limits)

    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options))

    def make_options(self, options: Optional[MechanismOptions] = None, *,
                     naming: Callable[[str], str] = str, **given: Any) -> MechanismOptions:
        """This mechanism's options: ``options`` itself (an instance of :attr:`options`), or built from the
        ``given`` fields that are not None (the others keep their defaults).  A field this mechanism does not
        take is refused, not ignored, as is ``options`` together with fields; ``naming`` says how the
        caller's user calls a field (a keyword, a flag) in an error."""
        given = {name: value for name, value in given.items() if value is not None}
        if options is not None:
            if not isinstance(options, self.options):
                raise InvalidParameterError(f"mechanism {self.name!r} takes options of type {self.options.__name__}, "
                                            f"got {type(options).__name__}")
            if given:
                raise InvalidParameterError(f"give the options of mechanism {self.name!r} either as an "
                                            f"{self.options.__name__} or as {', '.join(map(naming, given))}, not both")
            return options
        foreign = [name for name in given if name not in self.option_names()]
        if foreign:
            raise InvalidParameterError(inapplicable_option(foreign[0], self.name, naming))
        try:
            return self.options(**given)
        except InvalidParameterError as err:  # the option's own check, renamed the caller's way
            name = next((name for name in given if str(err).startswith(name)), None)
            raise InvalidParameterError(str(err) if name is None else naming(name) + str(err)[len(name):]) from None

    def build_event(self, noise: float, options: Optional[MechanismOptions] = None,
                    facts: RunFacts = RunFacts()) -> MechanismEvent:
        """The per-step event of this mechanism at ``noise`` (in :attr:`noise`'s unit), with its ``options``
        (default: every option's default) and the run's ``facts``; the noise is checked as the accountants
        take it (:meth:`check_noise`)."""
        options = self.make_options(options)
        self.check_noise(noise, facts.clip)
        return self.event(noise, options, facts)


def mechanisms_taking(option: str) -> tuple[str, ...]:
    """The registered mechanisms whose options have a field ``option``."""
    return tuple(name for name, spec in MECHANISMS.items() if option in spec.option_names())


def inapplicable_option(option: str, mechanism: str, naming: Callable[[str], str] = str) -> str:
    """Why ``option`` is refused for ``mechanism``, naming the mechanisms that take it."""
    takers = mechanisms_taking(option)
    where = f"only to {', '.join(takers)}" if takers else "no registered mechanism takes it"
    return f"{naming(option)} does not apply to mechanism {mechanism!r} ({where})"


@dataclass(frozen=True)
class OptionField:
    """One side parameter as the commands offer it: its field name, flag, help, value type (``Optional``
    removed) and the registered mechanisms that take it."""

    name: str
    flag: str
    help: str
    type: type
    mechanisms: tuple[str, ...]


def option_fields() -> dict[str, OptionField]:
    """Every registered mechanism's option fields by name (declared as the first mechanism that has the name
    declares it), in registration order: what the commands generate their option flags from."""
    found: dict[str, OptionField] = {}
    for spec in MECHANISMS.values():
        hints = get_type_hints(spec.options)
        for option in fields(spec.options):
            if option.name not in found:
                kind = hints[option.name]
                if get_origin(kind) is Union:
                    (kind,) = [arg for arg in get_args(kind) if arg is not type(None)]
                flag = option.metadata.get("flag") or "--" + option.name.replace("_", "-")
                found[option.name] = OptionField(option.name, flag, option.metadata.get("help", ""), kind,
                                                 mechanisms_taking(option.name))
    return found


def noise_parameters() -> dict[str, NoiseParameter]:
    """The noise units of the registered mechanisms, by keyword."""
    return {spec.noise.keyword: spec.noise for spec in MECHANISMS.values()}


MECHANISMS: dict[str, MechanismSpec] = {}


def register_mechanism(spec: MechanismSpec) -> MechanismSpec:
    """Add ``spec`` to :data:`MECHANISMS` (its name must be new)."""
    if spec.name in MECHANISMS:
        raise InvalidParameterError(f"mechanism {spec.name!r} is already registered")
    if (spec.clip_norm_ord is None) == (spec.perturbs == "gradients"):
        raise InvalidParameterError(f"mechanism {spec.name!r}: a clip_norm_ord is given iff it perturbs gradients")
    if not spec.accountants:
        raise InvalidParameterError(f"mechanism {spec.name!r} needs at least one accountant")
    known = noise_parameters().get(spec.noise.keyword)
    if known is not None and known != spec.noise:
        raise InvalidParameterError(f"mechanism {spec.name!r}: noise keyword {spec.noise.keyword!r} is already "
                                    f"another unit ({known.unit})")
    if not (isinstance(spec.options, type) and issubclass(spec.options, MechanismOptions)):
        raise InvalidParameterError(f"mechanism {spec.name!r}: options must be a MechanismOptions subclass")
    MECHANISMS[spec.name] = spec
    return spec


def get_mechanism_spec(name: str) -> MechanismSpec:
    """The registered mechanism ``name``; the error lists the known ones."""
    if name not in MECHANISMS:
        raise InvalidParameterError(f"unknown mechanism {name!r}; choose from {', '.join(sorted(MECHANISMS))}")
    return MECHANISMS[name]


def noise_from_keywords(mechanism: str, *, required: bool = True, **noise: Optional[float]) -> Optional[float]:
    """The one noise value given, as ``noise`` or under the keyword of ``mechanism``'s unit
    (``noise_multiplier``, ``laplace_scale``, ``concentration`` or a registered mechanism's own).

    Any other unit's keyword raises, naming the keyword the mechanism takes, so a noise is never read in
    the wrong unit; so do both ``noise`` and the unit's keyword.  Without either: an error if
    ``required``, else None (e.g. the noise is to be calibrated).
    """
    spec = get_mechanism_spec(mechanism)
    units = noise_parameters()
    unknown = sorted(set(noise) - set(units) - {"noise"})
    if unknown:
        raise InvalidParameterError(f"unknown noise keyword {unknown[0]!r}; choose from {sorted(units)}")
    given = {k: v for k, v in noise.items() if v is not None}
    wrong = sorted(set(given) - {spec.noise.keyword, "noise"})
    if wrong:
        raise InvalidParameterError(
            f"{wrong[0]} does not apply to mechanism {mechanism!r}: give {spec.noise.keyword} ({spec.noise.unit})")
    if len(given) > 1:
        raise InvalidParameterError(f"give the noise once: noise or {spec.noise.keyword}, not both")
    if not given and required:
        raise InvalidParameterError(f"{spec.noise.keyword} is required for mechanism {mechanism!r} ({spec.noise.unit})")
    return next(iter(given.values()), None)


def noise_keywords(mechanism: str, noise: float) -> dict[str, float]:
    """``{keyword: noise}`` for ``mechanism`` (e.g. ``{"laplace_scale": 0.5}`` for lap2)."""
    return {get_mechanism_spec(mechanism).noise.keyword: noise}
