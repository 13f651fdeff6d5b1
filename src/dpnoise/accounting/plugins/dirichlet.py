"""The Dirichlet output mechanism (inputs private, labels public): each selected example's softmax
s is released as a sample p~ ~ Dir(r s + alpha), and the loss is -log p~_y.

Replace-one adjacency with each sampled example's sample released: the exact two-vertex base RDP
subsampled with the example's inclusion visible, its release-count profile and, for two classes,
the PLD of the vertex pair (docs/theory/dirichlet.md Sec. 1-2).  The Dirichlet paper's readings of
its Theorem 10 (add/remove subsampling) are here under explicit names, flagged unsound.  The noise
is calibrated as the largest r in (0, alpha); the learning rate may be given as an effective one
(Sec. 4).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral
from typing import Optional

import numpy as np

from dpnoise.accounting.accountant import UnsoundAccountantWarning
from dpnoise.accounting.calibration import (
    CalibrationResult,
    UnreachableTargetError,
    epsilon_at_noise,
    solve_smallest,
    step_event_factory,
    validated_target,
)
from dpnoise.accounting.events import DirichletEvent
from dpnoise.accounting.mechanisms import (
    CONCENTRATION,
    OUTPUT_PRIVACY_SCOPE,
    AuditPair,
    MechanismOptions,
    MechanismSpec,
    RunFacts,
    side_option,
)
from dpnoise.accounting.pld.dirichlet import two_class_domain_problem, two_class_loss_range, two_class_vertex_pmfs
from dpnoise.accounting.pld.distribution import PldRoute
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin
from dpnoise.accounting.plugins.wording import add_remove_reading
from dpnoise.accounting.rdp.dirichlet import sampled_dirichlet_rdp
from dpnoise.accounting.registry import AccountantSpec, get_spec
from dpnoise.accounting.validation import ACCOUNTED_RANGE, InvalidParameterError, check_accounted, check_count


@dataclass(frozen=True, kw_only=True)
class DirichletOptions(MechanismOptions):
    """The Dirichlet mechanism's side parameters: the offset alpha of Dir(r s + alpha) and the number of
    classes d of the released softmax, where known (with 2 the default accountant has its exact two-class
    PLD route, docs/theory/dirichlet.md Sec. 1.3; a training output of another size is then refused)."""

    alpha: float = side_option(1.0, help="Dirichlet offset alpha > 0 (default 1)")
    num_classes: Optional[int] = side_option(
        None, flag="--classes",
        help="number of classes d >= 2 of the model's softmax output (default: not given, any d). With 2 the "
        "default accountant also has the exact two-class PLD route (dirichlet-pld); give it only if the model has "
        "exactly that many outputs")

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_accounted("alpha", self.alpha))
        if self.num_classes is not None:
            if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, Integral):
                raise InvalidParameterError(f"num_classes must be an integer >= 2 or None, got {self.num_classes!r}")
            object.__setattr__(self, "num_classes", check_count("num_classes", self.num_classes, 2))


def dirichlet_event(noise: float, options: DirichletOptions, facts: RunFacts) -> DirichletEvent:
    """r is the noise; alpha and the number of classes are the options."""
    return DirichletEvent(noise, options.alpha, options.num_classes)


def _rdp(base: str, subsampling: str):
    def rdp(event: DirichletEvent, q: float, orders: np.ndarray) -> np.ndarray:
        return sampled_dirichlet_rdp(q, event.r, event.alpha, orders, base, subsampling)

    rdp.__doc__ = f"The Poisson-sampled Dirichlet mechanism's RDP: {base} base bound, {subsampling} subsampling."
    return rdp


def _two_class_unavailable(event: DirichletEvent) -> Optional[str]:
    if event.num_classes != 2:
        return f"no PLD for DirichletEvent with num_classes={event.num_classes} (two classes only)"
    return None


def _two_class_loss_width(event: DirichletEvent, q: float) -> float | str:
    problem = two_class_domain_problem(event.r, event.alpha)
    if problem is not None:
        return problem
    # the changed example's inclusion is visible: sampling does not shrink its loss range
    low, high = two_class_loss_range(event.r, event.alpha)
    return high - low


def calibrate_dirichlet_r(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    alpha: float = 1.0,
    accountant: str = "dirichlet",
    num_classes: Optional[int] = None,
) -> CalibrationResult:
    """Largest r in (0, alpha) with h(r) <= target (docs/theory/dirichlet.md §3), by Brent on log(1/r).

    ``num_classes``: the number of classes of the perturbed output where known (with 2 the default
    accountant's two-class PLD route applies; None: any number).

    h is non-decreasing in r with near-jumps at r = alpha/(a-1); the answer is checked and stepped
    left if needed.  A target below the floor lim_{r->0} h(r) (docs/theory/dirichlet.md §2.3) raises
    :class:`UnreachableTargetError` stating the floor.
    """
    eps_t, delta, q, steps = validated_target(target_epsilon, delta, sample_rate, steps)
    options = DirichletOptions(alpha=alpha, num_classes=num_classes)
    alpha = options.alpha
    spec = get_spec(accountant)
    if spec.mechanism != "dirichlet":
        raise ValueError(f"accountant {accountant!r} is not a Dirichlet accountant")
    if not spec.sound:
        warnings.warn(spec.warning or "", UnsoundAccountantWarning, stacklevel=2)

    step_event = step_event_factory("dirichlet", q, options=options)

    def eps_of_inverse(inv_r: float) -> float:
        return epsilon_at_noise(accountant, step_event, 1.0 / inv_r, steps, delta)

    # h(r) is non-decreasing in r, i.e. non-increasing in 1/r; r < alpha keeps order 2 admissible.
    largest_inverse = min(1e9 / alpha, 1.0 / ACCOUNTED_RANGE[0])  # r >= alpha / 1e9, and an r the accountants take
    try:
        inv_r = solve_smallest(eps_of_inverse, eps_t, initial=2.0 / alpha, lower=1.0 / alpha, upper=largest_inverse,
                               name="1/r")
    except UnreachableTargetError as err:
        floor = eps_of_inverse(largest_inverse)
        raise UnreachableTargetError(
            f"epsilon={eps_t:g} is unreachable for the Dirichlet mechanism: as r -> 0 the "
            f"subsampled bound keeps a floor of epsilon={floor:.4g} (q={q:g}, steps={steps}, "
            f"delta={delta:g}; docs/theory/dirichlet.md §2.3). Raise epsilon, or use fewer steps or a "
            f"smaller sample rate."
        ) from err
    r = 1.0 / inv_r
    eps = eps_of_inverse(inv_r)
    return CalibrationResult(
        "dirichlet", accountant, r, eps, delta, q, steps, options=options, epsilon_by_accountant={accountant: eps},
    )


def calibrate_r(accountant: str, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                options: DirichletOptions) -> CalibrationResult:
    """The largest admissible r in (0, alpha) (:func:`~dpnoise.accounting.calibrate_dirichlet_r`)."""
    return calibrate_dirichlet_r(target_epsilon, delta, sample_rate, steps, alpha=options.alpha,
                                 accountant=accountant, num_classes=options.num_classes)


_SETTING = "alpha = 1, q = 0.00512, 5860 steps, delta = 1e-5"
#: each reading's own calibration to epsilon 4 in that setting, and its true epsilon there: for
#: dirichlet-add-remove (r* 0.3333) a Monte-Carlo and exact-PLD bound, for dirichlet-ponnoprat (r* 0.2481)
#: dpnoise.audit.pld.lower_bound (docs/theory/dirichlet.md, pitfall "Reading of Theorem 10"; docs/AUDITS.md)
_ADD_REMOVE_EXAMPLE = f" (e.g. 4 where the true epsilon is above 18 at r = 0.3333, {_SETTING})"
_PONNOPRAT_EXAMPLE = f" (e.g. 4 where the true epsilon is at least 13.39 at r = 0.2481, {_SETTING})"

PLUGIN = register_plugin(MechanismPlugin(
    mechanism=MechanismSpec(
        name="dirichlet",
        description="Dirichlet output mechanism: p~ ~ Dir(r softmax(z) + alpha), loss -log p~_y",
        noise=CONCENTRATION, perturbs="outputs", noise_distribution="dirichlet",
        event=dirichlet_event, event_type=DirichletEvent, options=DirichletOptions,
        accountants=("dirichlet", "dirichlet-release-count", "dirichlet-rdp", "dirichlet-ponnoprat"),
        audit_pair=AuditPair("dirichlet-vertex"),
        scope=OUTPUT_PRIVACY_SCOPE, calibrate=calibrate_r, effective_lr=True,
    ),
    rdp={"replace-one": _rdp("exact-vertex", "replace-one"), "add-remove": _rdp("exact-vertex", "general"),
         "ponnoprat": _rdp("ponnoprat", "general"), "tight": _rdp("exact-vertex", "tight")},
    unsound_rdp=("add-remove", "ponnoprat", "tight"),
    pld=PldRoute(loss_width=_two_class_loss_width,
                 single_step=lambda event, q, grid: two_class_vertex_pmfs(q, event.r, event.alpha, grid),
                 unavailable=_two_class_unavailable),
    accountants=(
        AccountantSpec(
            "dirichlet-pld", "dirichlet", True,
            "Two-class Dirichlet mechanism (events recording num_classes=2; +inf otherwise), replace-one "
            "adjacency, each sampled example's sample released: the PLD of the dominating vertex pair "
            "Beta(alpha + r, alpha) vs Beta(alpha, alpha + r), one step being loss 0 with probability 1 - q "
            "(the example not sampled, visibly) and the pair's loss with probability q, discretised "
            "pessimistically and composed with its round-off bounded (docs/theory/dirichlet.md Sec. 1.3, "
            "2.4). Exact up to the discretisation.",
            kind="pld",
        ),
        AccountantSpec(
            "dirichlet-release-count", "dirichlet", True,
            "Dirichlet mechanism, replace-one adjacency, each sampled example's sample released: "
            "sum_k Bin(k; T, q) delta_k(eps), delta_k converted from the RDP k eps(a) of k releases at its "
            "own best order (exact two-vertex base RDP, as dirichlet-rdp; docs/theory/dirichlet.md "
            "Sec. 2.4). Never above dirichlet-rdp beyond rounding. One repeated release only (else +inf).",
            kind="release-count",
        ),
        AccountantSpec(
            "dirichlet-rdp", "dirichlet", True,
            "Dirichlet mechanism, replace-one adjacency (labels public, one private input changed), each "
            "sampled example's sample released: exact two-vertex base RDP, proven for integer orders and "
            "real orders >= 1.58034 (docs/theory/dirichlet.md Sec. 1.2), subsampled exactly as "
            "log(1 - q + q e^{(a-1) eps(a)}) / (a-1) (the example's inclusion is visible). Any number of "
            "classes (a dominating pair, and the exact PLD of dirichlet-pld, is known for two classes only, "
            "Sec. 1.3).",
        ),
        AccountantSpec(
            "dirichlet", "dirichlet", True,
            "The smallest of dirichlet-release-count, dirichlet-rdp and, for two classes, dirichlet-pld, per "
            "delta (all sound; replace-one adjacency, each sampled example's sample released).",
            kind="minimum", routes=("dirichlet-release-count", "dirichlet-rdp", "dirichlet-pld"),
        ),
        AccountantSpec(
            "dirichlet-add-remove", "dirichlet", False,
            "Dirichlet mechanism read as the paper's Theorem 10: exact two-vertex base RDP with Zhu & "
            "Wang's general add/remove subsampling bound (ICML 2019).",
            warning=add_remove_reading("dirichlet-add-remove", "Dirichlet", "dirichlet", _ADD_REMOVE_EXAMPLE),
            rdp_route="add-remove",
        ),
        AccountantSpec(
            "dirichlet-ponnoprat", "dirichlet", False,
            "Dirichlet mechanism as in the paper: Ponnoprat (2023, arXiv 2110.01984) base RDP + Zhu "
            "& Wang general subsampling.",
            warning=add_remove_reading("dirichlet-ponnoprat", "Dirichlet", "dirichlet", _PONNOPRAT_EXAMPLE),
            rdp_route="ponnoprat",
        ),
        AccountantSpec(
            "dirichlet-tight", "dirichlet", False,
            "Dirichlet with Zhu & Wang's tight subsampling form (docs/theory/dirichlet.md Sec. 2.2).",
            warning="dirichlet-tight applies Zhu & Wang's add/remove subsampling to a replace-one bound "
            "and assumes a condition of their tight form that is unproven for the Dirichlet mechanism. "
            "Use 'dirichlet' for a guarantee.",
            rdp_route="tight",
        ),
    ),
))
