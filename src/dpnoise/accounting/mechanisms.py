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
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

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
NOISE_PARAMETERS = {p.keyword: p for p in (NOISE_MULTIPLIER, LAPLACE_SCALE, CONCENTRATION)}

@dataclass(frozen=True)
class EventContext:
    """What a training run knows besides the noise, already checked by :meth:`MechanismSpec.build_event`:
    the clipping norm C, the number of trained parameters n (None: not given), the Dirichlet offset
    alpha and the number of classes (None: not given or not recorded)."""

    clip: float = 1.0
    params: Optional[int] = None
    alpha: Optional[float] = None
    num_classes: Optional[int] = None


#: (noise in the mechanism's unit, the run's context) -> the per-step event
EventFactory = Callable[[float, EventContext], MechanismEvent]


@dataclass(frozen=True)
class AuditPair:
    """The worst-case neighbouring pair of :func:`dpnoise.audit.pld.lower_bound`.

    ``family``: a pair family of :data:`dpnoise.audit.pld.PAIR_FAMILIES`, e.g. "gaussian-shift",
    "laplace-shift" (a one-coordinate shift of C), "laplace-spread" (the shifts
    (C / sqrt(k))(1,..,1,0,..) over k, for L2 clipping with i.i.d. Laplace noise) or
    "dirichlet-vertex"; ``noise_factor`` converts the mechanism's noise to the pair's (the
    penultimate-layer Gaussian moves a clipped activation by up to 2C: sigma / 2).
    """

    family: str
    noise_factor: float = 1.0


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
    #: the event takes the Dirichlet offset alpha; calibration then searches r in (0, alpha)
    uses_alpha: bool = False
    #: the event records the number of classes of the perturbed output, where known (Dirichlet:
    #: with two classes its PLD route applies)
    uses_num_classes: bool = False
    #: what the epsilon covers when it is not the trained model (output mechanisms)
    scope: Optional[str] = None
    #: secure mode's exact integer noise for this mechanism (docs/theory/secure_noise.md); None: no
    #: secure mode (the output mechanisms draw their noise in the model's forward pass)
    secure_noise: Optional[Literal["discrete-gaussian", "discrete-laplace"]] = None
    #: the calibrator of a mechanism whose noise is not searched as sigma or b / C
    #: (``calibrate(accountant, target_epsilon, delta, sample_rate, steps, alpha=, num_classes=)``,
    #: the Dirichlet r in (0, alpha)); None: :func:`dpnoise.accounting.calibrate_noise`
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

    def checked_alpha(self, alpha: Optional[float], name: str = "alpha") -> float:
        """The Dirichlet offset of a run of this mechanism: ``alpha`` checked finite and > 0, or the
        default 1.0 where not given; ``name`` is the keyword or flag named in an error."""
        if not self.uses_alpha:
            raise InvalidParameterError(f"{name} is a Dirichlet parameter; mechanism {self.name!r} does not take it")
        return check_accounted(name, 1.0 if alpha is None else alpha)

    def build_event(self, noise: float, clip: float = 1.0, params: Optional[int] = None,
                    alpha: Optional[float] = None, num_classes: Optional[int] = None) -> MechanismEvent:
        """The per-step event of this mechanism at ``noise`` (in :attr:`noise`'s unit).

        As in ``make_private``: the clipping norm ``clip`` (finite, > 0) and the number of trained
        parameters ``params`` (an integer >= 1, or None) are checked for every mechanism, also where
        the event does not depend on them (the Gaussian's sigma is already relative to C; only Lap2
        uses n), since they describe the training run; the Dirichlet offset ``alpha`` and the number
        of classes ``num_classes`` (an integer >= 2, or None: not recorded) are refused by a
        mechanism that does not take them.
        """
        clip = check_positive("clip", clip)
        params = None if params is None else check_count("params", params, 1)
        alpha = None if alpha is None else self.checked_alpha(alpha)
        self.check_noise(noise, clip)
        if num_classes is not None and not self.uses_num_classes:
            raise InvalidParameterError(f"num_classes is recorded by the Dirichlet mechanism only; mechanism "
                                        f"{self.name!r} does not take it")
        return self.event(noise, EventContext(clip, params, alpha, num_classes))


MECHANISMS: dict[str, MechanismSpec] = {}


def register_mechanism(spec: MechanismSpec) -> MechanismSpec:
    """Add ``spec`` to :data:`MECHANISMS` (its name must be new)."""
    if spec.name in MECHANISMS:
        raise InvalidParameterError(f"mechanism {spec.name!r} is already registered")
    if (spec.clip_norm_ord is None) == (spec.perturbs == "gradients"):
        raise InvalidParameterError(f"mechanism {spec.name!r}: a clip_norm_ord is given iff it perturbs gradients")
    if not spec.accountants:
        raise InvalidParameterError(f"mechanism {spec.name!r} needs at least one accountant")
    MECHANISMS[spec.name] = spec
    return spec


def get_mechanism_spec(name: str) -> MechanismSpec:
    """The registered mechanism ``name``; the error lists the known ones."""
    if name not in MECHANISMS:
        raise InvalidParameterError(f"unknown mechanism {name!r}; choose from {', '.join(sorted(MECHANISMS))}")
    return MECHANISMS[name]


def noise_from_keywords(mechanism: str, *, required: bool = True, **noise: Optional[float]) -> Optional[float]:
    """The one noise value given among ``noise_multiplier`` / ``laplace_scale`` / ``concentration``.

    Only the keyword of ``mechanism``'s unit may be set (not None); any other raises, naming the
    keyword the mechanism takes, so a noise is never read in the wrong unit.  Without it: an
    error if ``required``, else None (e.g. the noise is to be calibrated).
    """
    spec = get_mechanism_spec(mechanism)
    unknown = sorted(set(noise) - set(NOISE_PARAMETERS))
    if unknown:
        raise InvalidParameterError(f"unknown noise keyword {unknown[0]!r}; choose from {sorted(NOISE_PARAMETERS)}")
    given = {k: v for k, v in noise.items() if v is not None}
    wrong = sorted(set(given) - {spec.noise.keyword})
    if wrong:
        raise InvalidParameterError(
            f"{wrong[0]} does not apply to mechanism {mechanism!r}: give {spec.noise.keyword} ({spec.noise.unit})")
    if spec.noise.keyword not in given and required:
        raise InvalidParameterError(f"{spec.noise.keyword} is required for mechanism {mechanism!r} ({spec.noise.unit})")
    return given.get(spec.noise.keyword)


def noise_keywords(mechanism: str, noise: float) -> dict[str, float]:
    """``{keyword: noise}`` for ``mechanism`` (e.g. ``{"laplace_scale": 0.5}`` for lap2)."""
    return {get_mechanism_spec(mechanism).noise.keyword: noise}
