"""Named accountants: how each mechanism of :data:`~dpnoise.accounting.mechanisms.MECHANISMS` is accounted,
each added by :func:`register_accountant`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from dpnoise.accounting.mechanisms import MECHANISMS, get_mechanism_spec
from dpnoise.accounting.rdp.registry import AccountingMethods
from dpnoise.accounting.validation import InvalidParameterError


AccountantKind = Literal["rdp", "pld", "minimum", "release-count"]


@dataclass(frozen=True)
class AccountantSpec:
    """A named accountant: the mechanism it accounts for and how.

    ``kind``: "rdp" (Renyi DP with ``methods``), "pld" (dp_accounting's privacy loss
    distributions), "minimum" (per delta, the smallest epsilon of the sound ``routes``) or
    "release-count" (an output mechanism's profile as the Bin(T, q) mixture over the changed
    example's number of releases, :mod:`dpnoise.accounting.release_count`).
    """

    name: str
    mechanism: str
    methods: AccountingMethods
    sound: bool
    description: str
    warning: Optional[str] = None
    kind: AccountantKind = "rdp"
    routes: tuple[str, ...] = ()

    @property
    def scope(self) -> Optional[str]:
        """What the epsilon covers when it is not the trained model (the mechanism's scope)."""
        return get_mechanism_spec(self.mechanism).scope


ACCOUNTANTS: dict[str, AccountantSpec] = {}


def _refusal(spec: AccountantSpec) -> Optional[str]:
    """Why ``spec`` cannot be registered now (None if it can)."""
    if spec.name in ACCOUNTANTS:
        return "is already registered"
    if spec.mechanism not in MECHANISMS:
        return f"accounts for mechanism {spec.mechanism!r}, which is not registered (register_mechanism first)"
    if spec.kind not in get_args(AccountantKind):
        return f"has kind {spec.kind!r}; choose from {', '.join(get_args(AccountantKind))}"
    if spec.sound and spec.warning is not None:
        return "is sound and takes no warning"
    if not spec.sound and spec.warning is None:
        return "is not sound and needs a warning (printed with its epsilons)"
    if spec.kind != "minimum":
        return f"is of kind {spec.kind!r}, which takes no routes (a minimum does)" if spec.routes else None
    if not spec.routes:
        return "is a minimum of routes and needs at least one"
    if not spec.sound:
        return "is a minimum of sound routes and must be declared sound"
    for route in spec.routes:
        if route not in ACCOUNTANTS:
            return f"has route {route!r}, which is not registered (register the routes before their minimum)"
        if ACCOUNTANTS[route].mechanism != spec.mechanism:
            return f"has route {route!r} of mechanism {ACCOUNTANTS[route].mechanism!r}, not {spec.mechanism!r}"
        if not ACCOUNTANTS[route].sound:
            return f"has route {route!r}, which is not sound (a minimum is a proven bound over sound routes only)"
    return None


def register_accountant(spec: AccountantSpec) -> AccountantSpec:
    """Add ``spec`` to :data:`ACCOUNTANTS`, after checking it.

    Refused (:class:`InvalidParameterError` naming the accountant): a name already registered; a
    mechanism not in :data:`MECHANISMS`; an unknown kind; an unsound accountant without a warning or
    a sound one with a warning; routes on an accountant that is not a minimum; a minimum without
    routes, not declared sound, or with a route that is not registered yet, of another mechanism or
    not sound.  A minimum is listed just before the first of its routes (the command line lists a
    mechanism's default accountant first): register the routes, then their minimum.
    """
    reason = _refusal(spec)
    if reason is not None:
        raise InvalidParameterError(f"accountant {spec.name!r} {reason}")
    if spec.kind != "minimum":
        ACCOUNTANTS[spec.name] = spec
        return spec
    entries = list(ACCOUNTANTS.items())
    entries.insert(min(list(ACCOUNTANTS).index(route) for route in spec.routes), (spec.name, spec))
    ACCOUNTANTS.clear()  # in place: modules hold a reference to the one dictionary
    ACCOUNTANTS.update(entries)
    return spec


_SOUND = AccountingMethods()


def _add_remove_reading(name: str, mechanism: str, default: str, example: str = "") -> str:
    """The warning of an output mechanism's accountant that reads its subsampling as add/remove."""
    return (f"{name} applies an add/remove subsampling bound to the {mechanism} mechanism's replace-one base "
            "bound, as the Dirichlet paper's Theorem 10 does: it is NOT a valid bound under replace-one "
            f"adjacency, where each sampled example's output is released with it{example} "
            f"(docs/theory/dirichlet.md, pitfall \"Reading of Theorem 10\"). Use '{default}' for a guarantee.")


_DIRICHLET_SETTING = "alpha = 1, q = 0.00512, 5860 steps, delta = 1e-5"
#: each reading's own calibration to epsilon 4 in that setting, and its true epsilon there: for
#: dirichlet-add-remove (r* 0.3333) a Monte-Carlo and exact-PLD bound, for dirichlet-ponnoprat (r* 0.2481)
#: dpnoise.audit.pld.lower_bound (docs/theory/dirichlet.md, pitfall "Reading of Theorem 10"; docs/AUDITS.md)
_ADD_REMOVE_EXAMPLE = f" (e.g. 4 where the true epsilon is above 18 at r = 0.3333, {_DIRICHLET_SETTING})"
_PONNOPRAT_EXAMPLE = f" (e.g. 4 where the true epsilon is at least 13.39 at r = 0.2481, {_DIRICHLET_SETTING})"
_PLD_NOTE = (
    "dp_accounting's privacy loss distribution with pessimistic (connect-the-dots) rounding, "
    "arXiv 2207.04380"
)


def _register_pld_and_rdp(mechanism: str, pld: str, rdp: str) -> None:
    """The default accountant of a Gaussian/Laplace mechanism, min(PLD, RDP), after both routes."""
    register_accountant(AccountantSpec(f"{mechanism}-pld", mechanism, _SOUND, True, f"{pld}: {_PLD_NOTE}.", kind="pld"))
    register_accountant(AccountantSpec(f"{mechanism}-rdp", mechanism, _SOUND, True, rdp))
    register_accountant(AccountantSpec(
        mechanism, mechanism, _SOUND, True,
        f"The smaller of {mechanism}-pld (primary) and {mechanism}-rdp, per delta (both sound).",
        kind="minimum", routes=(f"{mechanism}-pld", f"{mechanism}-rdp"),
    ))


_register_pld_and_rdp(
    "gaussian",
    "Poisson-sampled Gaussian mechanism",
    "Sampled Gaussian mechanism RDP (Mironov, Talwar, Zhang 2019, arXiv 1908.10530); exact "
    "at integer orders.",
)
_register_pld_and_rdp(
    "laplace-l1",
    "Poisson-sampled Laplace mechanism (L1 clipping: one-coordinate shift of C)",
    "Poisson-sampled Laplace with L1 clipping: exact binomial expansion of the 1-D shift "
    "at integer orders (Zhu & Wang 2019 tight form, which holds for Laplace).",
)
register_accountant(AccountantSpec(
    "penultimate-gaussian-exact", "penultimate-gaussian", _SOUND, True,
    "Gaussian noise on per-example clipped penultimate activations, replace-one adjacency, each "
    "sampled example's noisy activation released: the exact privacy profile, sum_k Bin(k; T, q) "
    "delta_k(eps) with delta_k that of sqrt(k) mu-GDP, mu = 2 / sigma (docs/theory/dirichlet.md "
    "Sec. 2.4). One repeated release only (else +inf).",
    kind="release-count",
))
register_accountant(AccountantSpec(
    "penultimate-gaussian-replace-one-rdp", "penultimate-gaussian",
    AccountingMethods(gaussian_release="replace-one"), True,
    "Gaussian noise on per-example clipped penultimate activations (reconstruction of Monir & "
    "Ghinita 2024, docs/theory/dirichlet.md Sec. 6), replace-one adjacency, each sampled "
    "example's noisy activation released: Gaussian RDP at multiplier sigma/2 (input replacement "
    "moves a clipped activation by up to 2C), subsampled exactly as log(1 - q + q e^{(a-1) eps(a)}) "
    "/ (a-1) (the example's inclusion is visible). RDP only.",
))
register_accountant(AccountantSpec(
    "penultimate-gaussian", "penultimate-gaussian", _SOUND, True,
    "The smaller of penultimate-gaussian-exact and penultimate-gaussian-replace-one-rdp, per delta "
    "(both sound; replace-one adjacency, each sampled example's noisy activation released).",
    kind="minimum", routes=("penultimate-gaussian-exact", "penultimate-gaussian-replace-one-rdp"),
))
register_accountant(AccountantSpec(
    "penultimate-gaussian-pld", "penultimate-gaussian", AccountingMethods(), False,
    f"Poisson-sampled Gaussian PLD (add/remove) at noise multiplier sigma/2: {_PLD_NOTE}.",
    warning=_add_remove_reading("penultimate-gaussian-pld", "penultimate-layer Gaussian", "penultimate-gaussian"),
    kind="pld",
))
register_accountant(AccountantSpec(
    "penultimate-gaussian-rdp", "penultimate-gaussian", AccountingMethods(), False,
    "Sampled Gaussian RDP (add/remove) at noise multiplier sigma/2.",
    warning=_add_remove_reading("penultimate-gaussian-rdp", "penultimate-layer Gaussian", "penultimate-gaussian"),
))
register_accountant(AccountantSpec(
    "lap2-rdp", "lap2", _SOUND, True,
    "Sound L2-clipped Laplace RDP (docs/theory/lap2.md Sec. 4): one Bernoulli draw for all "
    "coordinates; per order min(max(add expansion, remove lemma), Zhu-Wang general) with "
    "base moments min(majorization sum, Gaussian domination).",
))
register_accountant(AccountantSpec(
    "lap2-gdp", "lap2", _SOUND, True,
    "One Lap2 step is M_n-GDP (M_n < sqrt(pi/2) C/b; docs/theory/lap2.md Sec. 10), so the "
    f"Poisson-sampled Gaussian PLD at noise multiplier 1/M_n bounds it: {_PLD_NOTE}.",
    kind="pld",
))
register_accountant(AccountantSpec(
    "lap2", "lap2", _SOUND, True,
    "The smaller of lap2-rdp and lap2-gdp, per delta (both sound).",
    kind="minimum", routes=("lap2-rdp", "lap2-gdp"),
))
register_accountant(AccountantSpec(
    "lap2-paper", "lap2", AccountingMethods(lap2="paper"), False,
    "The majorization accountant of Mohammady et al., \"Lap2: Revisiting Laplace DP-SGD for "
    "High Dimensions via Majorization Theory\", exactly as published (see "
    "docs/theory/lap2.md Sec. 3; Thm III.7).",
    warning="lap2-paper is the published Lap2 accountant, which is NOT a valid privacy bound "
    "in general: it subsamples each coordinate independently (docs/theory/lap2.md Sec. 3). "
    "Its epsilon can be below the true epsilon (e.g. 7.94 vs a proven lower bound of ~31.7 "
    "at b/C = 0.4 in the paper's MNIST setting). Use 'lap2' for a guarantee.",
))
register_accountant(AccountantSpec(
    "lap2-add-only", "lap2", AccountingMethods(lap2="add-only"), False,
    "Lap2, add direction only (exact binomial expansion with the sound base moments).",
    warning="lap2-add-only bounds only the add direction D(mu||P0) of add/remove adjacency; "
    "it is not a guarantee for removal. Use 'lap2' for a guarantee.",
))
register_accountant(AccountantSpec(
    "dirichlet-pld", "dirichlet", _SOUND, True,
    "Two-class Dirichlet mechanism (events recording num_classes=2; +inf otherwise), replace-one "
    "adjacency, each sampled example's sample released: the PLD of the dominating vertex pair "
    "Beta(alpha + r, alpha) vs Beta(alpha, alpha + r), one step being loss 0 with probability 1 - q "
    "(the example not sampled, visibly) and the pair's loss with probability q, discretised "
    "pessimistically and composed with its round-off bounded (docs/theory/dirichlet.md Sec. 1.3, "
    "2.4). Exact up to the discretisation.",
    kind="pld",
))
register_accountant(AccountantSpec(
    "dirichlet-release-count", "dirichlet", AccountingMethods(), True,
    "Dirichlet mechanism, replace-one adjacency, each sampled example's sample released: "
    "sum_k Bin(k; T, q) delta_k(eps), delta_k converted from the RDP k eps(a) of k releases at its "
    "own best order (exact two-vertex base RDP, as dirichlet-rdp; docs/theory/dirichlet.md "
    "Sec. 2.4). Never above dirichlet-rdp beyond rounding. One repeated release only (else +inf).",
    kind="release-count",
))
register_accountant(AccountantSpec(
    "dirichlet-rdp", "dirichlet", AccountingMethods(), True,
    "Dirichlet mechanism, replace-one adjacency (labels public, one private input changed), each "
    "sampled example's sample released: exact two-vertex base RDP, proven for integer orders and "
    "real orders >= 1.58034 (docs/theory/dirichlet.md Sec. 1.2), subsampled exactly as "
    "log(1 - q + q e^{(a-1) eps(a)}) / (a-1) (the example's inclusion is visible). Any number of "
    "classes (a dominating pair, and the exact PLD of dirichlet-pld, is known for two classes only, "
    "Sec. 1.3).",
))
register_accountant(AccountantSpec(
    "dirichlet", "dirichlet", _SOUND, True,
    "The smallest of dirichlet-release-count, dirichlet-rdp and, for two classes, dirichlet-pld, per "
    "delta (all sound; replace-one adjacency, each sampled example's sample released).",
    kind="minimum", routes=("dirichlet-release-count", "dirichlet-rdp", "dirichlet-pld"),
))
register_accountant(AccountantSpec(
    "dirichlet-add-remove", "dirichlet", AccountingMethods(dirichlet_subsampling="general"), False,
    "Dirichlet mechanism read as the paper's Theorem 10: exact two-vertex base RDP with Zhu & "
    "Wang's general add/remove subsampling bound (ICML 2019).",
    warning=_add_remove_reading("dirichlet-add-remove", "Dirichlet", "dirichlet", _ADD_REMOVE_EXAMPLE),
))
register_accountant(AccountantSpec(
    "dirichlet-ponnoprat", "dirichlet",
    AccountingMethods(dirichlet_base="ponnoprat", dirichlet_subsampling="general"), False,
    "Dirichlet mechanism as in the paper: Ponnoprat (2023, arXiv 2110.01984) base RDP + Zhu "
    "& Wang general subsampling.",
    warning=_add_remove_reading("dirichlet-ponnoprat", "Dirichlet", "dirichlet", _PONNOPRAT_EXAMPLE),
))
register_accountant(AccountantSpec(
    "dirichlet-tight", "dirichlet",
    AccountingMethods(dirichlet_subsampling="tight"), False,
    "Dirichlet with Zhu & Wang's tight subsampling form (docs/theory/dirichlet.md Sec. 2.2).",
    warning="dirichlet-tight applies Zhu & Wang's add/remove subsampling to a replace-one bound "
    "and assumes a condition of their tight form that is unproven for the Dirichlet mechanism. "
    "Use 'dirichlet' for a guarantee.",
))


def accountants_for_mechanism(mechanism: str, include_options: bool = False) -> list[str]:
    """Names of the accountants that apply to ``mechanism``, the default (sound) one first."""
    reported = list(get_mechanism_spec(mechanism).accountants)
    if include_options:
        return reported + [n for n, s in ACCOUNTANTS.items() if s.mechanism == mechanism and n not in reported]
    return reported


def get_spec(name: str) -> AccountantSpec:
    """The named accountant's spec (``ValueError`` naming the choices if unknown)."""
    if name not in ACCOUNTANTS:
        raise InvalidParameterError(f"unknown accountant {name!r}; choose from {sorted(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]


def _check_registries() -> None:
    """Every mechanism's accountants are registered and account for it, its default one sound (what
    :func:`register_accountant` cannot check alone, once every mechanism has its accountants)."""
    for mechanism in MECHANISMS.values():
        if any(get_spec(name).mechanism != mechanism.name for name in mechanism.accountants):
            raise InvalidParameterError(f"mechanism {mechanism.name!r} lists an accountant of another mechanism")
        if not get_spec(mechanism.default_accountant).sound:
            raise InvalidParameterError(f"mechanism {mechanism.name!r}: its default accountant must be sound")

_check_registries()
