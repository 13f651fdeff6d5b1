"""Named accountants and mechanisms: what the CLI, the trainer and the audits refer to by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from dpnoise.accounting.events import (
    DirichletEvent,
    GaussianEvent,
    Lap2Event,
    LaplaceEvent,
    MechanismEvent,
)
from dpnoise.accounting.rdp.registry import AccountingMethods
from dpnoise.accounting.validation import check_count, check_positive

#: Printed next to every Dirichlet / penultimate-layer epsilon (spec dirichlet.md §5).
OUTPUT_PRIVACY_SCOPE = (
    "Scope: this epsilon bounds what the released noisy outputs reveal about the private inputs "
    "(labels are public). It is NOT a guarantee for the trained model's parameters: the SGD "
    "update is not a post-processing of the released outputs, since it depends on the private "
    "input through the network's Jacobian (spec dirichlet.md §5)."
)


def _gaussian(noise: float, clip: float, params: Optional[int], alpha: Optional[float]) -> MechanismEvent:
    return GaussianEvent(check_positive("noise", noise))


def _penultimate_gaussian(noise: float, clip: float, params: Optional[int], alpha: Optional[float]) -> MechanismEvent:
    # Each selected example's activation (clipped to norm C) gets N(0, (sigma C)^2); replacing the
    # private input moves it by up to 2C, so the sensitivity-1 noise multiplier is sigma / 2.
    return GaussianEvent(check_positive("noise", noise) / 2.0)


def _laplace_l1(noise: float, clip: float, params: Optional[int], alpha: Optional[float]) -> MechanismEvent:
    return LaplaceEvent(check_positive("noise", noise) / check_positive("clip", clip))


def _lap2(noise: float, clip: float, params: Optional[int], alpha: Optional[float]) -> MechanismEvent:
    if params is None:
        raise ValueError("params (the number of trained parameters n) is required for lap2")
    return Lap2Event(
        check_positive("noise", noise) / check_positive("clip", clip), check_count("params", params, 1)
    )


def _dirichlet(noise: float, clip: float, params: Optional[int], alpha: Optional[float]) -> MechanismEvent:
    return DirichletEvent(check_positive("noise (r)", noise), check_positive("alpha", 1.0 if alpha is None else alpha))


EventFactory = Callable[[float, float, Optional[int], Optional[float]], MechanismEvent]

#: Mechanism name -> factory building its per-step event from (noise, clip, params, alpha).
#: Units of ``noise``: sigma (multiplier of C) for the Gaussians, absolute Laplace scale b for
#: laplace-l1 and lap2, r for dirichlet.
MECHANISMS: dict[str, EventFactory] = {
    "gaussian": _gaussian,
    "laplace-l1": _laplace_l1,
    "lap2": _lap2,
    "dirichlet": _dirichlet,
    "penultimate-gaussian": _penultimate_gaussian,
}


@dataclass(frozen=True)
class AccountantSpec:
    """A named accountant: the mechanism it accounts for and the bounds it uses."""

    name: str
    mechanism: str
    methods: AccountingMethods
    sound: bool
    description: str
    warning: Optional[str] = None
    scope: Optional[str] = None


_SOUND = AccountingMethods()

ACCOUNTANTS: dict[str, AccountantSpec] = {
    spec.name: spec
    for spec in [
        AccountantSpec(
            "gaussian", "gaussian", _SOUND, True,
            "Sampled Gaussian mechanism RDP (Mironov, Talwar, Zhang 2019); exact at integer orders.",
        ),
        AccountantSpec(
            "laplace-l1", "laplace-l1", _SOUND, True,
            "Poisson-sampled Laplace with L1 clipping: exact binomial expansion of the 1-D shift "
            "(Zhu & Wang 2019 tight form, which holds for Laplace).",
        ),
        AccountantSpec(
            "lap2", "lap2", _SOUND, True,
            "Sound L2-clipped Laplace accountant (spec lap2.md §4): one Bernoulli draw for all "
            "coordinates; per order min(max(add expansion, remove lemma), Zhu-Wang general) with "
            "base moments min(majorization sum, Gaussian domination).",
        ),
        AccountantSpec(
            "lap2-paper", "lap2", AccountingMethods(lap2="paper"), False,
            "The seed's majorization accountant exactly as published (Thm III.7).",
            warning="lap2-paper is the published Lap2 accountant, which is NOT a valid privacy bound "
            "in general: it subsamples each coordinate independently (spec lap2.md §3). Its epsilon "
            "can be below the true epsilon (e.g. 7.94 vs a proven lower bound of ~31.7 at b/C = 0.4 "
            "in the seed's MNIST setting). Use 'lap2' for a guarantee.",
        ),
        AccountantSpec(
            "lap2-add-only", "lap2", AccountingMethods(lap2="add-only"), False,
            "Lap2, add direction only (exact binomial expansion with the sound base moments).",
            warning="lap2-add-only bounds only the add direction D(mu||P0) of add/remove adjacency; "
            "it is not a guarantee for removal. Use 'lap2' for a guarantee.",
        ),
        AccountantSpec(
            "dirichlet", "dirichlet", _SOUND, True,
            "Dirichlet mechanism: Ponnoprat (2023) base RDP + Zhu & Wang (2019) general Poisson "
            "subsampling bound (spec dirichlet.md §1-3).",
            scope=OUTPUT_PRIVACY_SCOPE,
        ),
        AccountantSpec(
            "dirichlet-exact-vertex", "dirichlet",
            AccountingMethods(dirichlet_base="exact-vertex"), False,
            "Dirichlet with the exact two-vertex base RDP (spec dirichlet.md §1.2).",
            warning="dirichlet-exact-vertex uses a worst case found numerically, not proven "
            "(spec dirichlet.md §1.2). Use 'dirichlet' for a guarantee.",
            scope=OUTPUT_PRIVACY_SCOPE,
        ),
        AccountantSpec(
            "dirichlet-tight", "dirichlet",
            AccountingMethods(dirichlet_subsampling="tight"), False,
            "Dirichlet with Zhu & Wang's tight subsampling form (spec dirichlet.md §2.2).",
            warning="dirichlet-tight assumes a condition of Zhu & Wang's tight bound that is "
            "unproven for the Dirichlet mechanism. Use 'dirichlet' for a guarantee.",
            scope=OUTPUT_PRIVACY_SCOPE,
        ),
        AccountantSpec(
            "penultimate-gaussian", "penultimate-gaussian", _SOUND, True,
            "Gaussian noise on per-example clipped penultimate activations (reconstruction of Monir "
            "& Ghinita 2024, spec dirichlet.md §6): sampled Gaussian RDP at multiplier sigma/2 "
            "(input replacement moves a clipped activation by up to 2C).",
            scope=OUTPUT_PRIVACY_SCOPE,
        ),
    ]
}

#: The accountants reported side by side for each mechanism (the default first).
_REPORTED: dict[str, list[str]] = {
    "gaussian": ["gaussian"],
    "laplace-l1": ["laplace-l1"],
    "lap2": ["lap2", "lap2-paper"],
    "dirichlet": ["dirichlet"],
    "penultimate-gaussian": ["penultimate-gaussian"],
}


def accountants_for_mechanism(mechanism: str, include_options: bool = False) -> list[str]:
    """Names of the accountants that apply to ``mechanism``, the default (sound) one first."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose from {sorted(MECHANISMS)}")
    if include_options:
        return [n for n, s in ACCOUNTANTS.items() if s.mechanism == mechanism]
    return list(_REPORTED[mechanism])


def get_spec(name: str) -> AccountantSpec:
    """The named accountant's spec (``ValueError`` naming the choices if unknown)."""
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; choose from {sorted(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]
