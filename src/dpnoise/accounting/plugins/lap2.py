"""Lap2 (Mohammady et al., arXiv 2602.23516, "Lap2: Revisiting Laplace DP-SGD for High Dimensions via
Majorization Theory"): per-example L2 clipping to C, i.i.d. Laplace(b) noise on each of the n
coordinates of the sum.

Sound routes: the L2-clipped Laplace RDP with one Bernoulli draw for all coordinates
(docs/theory/lap2.md Sec. 4), and the PLD of the Poisson-sampled Gaussian at noise multiplier 1/M_n,
one step being M_n-GDP (Sec. 10).  The published majorization accountant (Thm III.7) is here under
the explicit name ``lap2-paper``, flagged unsound.
"""

from __future__ import annotations

import math

import numpy as np

from dpnoise.accounting.calibration import CalibrationResult, calibrate_noise
from dpnoise.accounting.events import Lap2Event
from dpnoise.accounting.mechanisms import LAPLACE_SCALE, AuditPair, NoOptions, RunFacts, MechanismSpec
from dpnoise.accounting.pld.distribution import PldRoute, gaussian_loss_width
from dpnoise.accounting.pld.gdp import lap2_gdp_mu
from dpnoise.accounting.pld.single_step import gaussian_pmfs
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin
from dpnoise.accounting.plugins.wording import PLD_NOTE
from dpnoise.accounting.rdp.lap2 import lap2_add_only_rdp, lap2_paper_rdp, lap2_sound_rdp
from dpnoise.accounting.registry import AccountantSpec, get_spec
from dpnoise.accounting.validation import InvalidParameterError


def lap2_event(noise: float, options: NoOptions, facts: RunFacts) -> Lap2Event:
    """b is absolute (the event's noise multiplier is b / C); the event needs n."""
    if facts.params is None:
        raise InvalidParameterError("params (the number of trained parameters n) is required for lap2")
    return Lap2Event(noise / facts.clip, facts.params)


def dominating_noise_multiplier(event: Lap2Event) -> float:
    """The Gaussian noise multiplier 1 / M_n whose PLD bounds one Lap2 step's (docs/theory/lap2.md Sec. 10)."""
    mu = lap2_gdp_mu(event.noise_multiplier, event.num_params)
    return 1.0 / mu if mu > 0 else math.inf


def _rdp(bound):
    def rdp(event: Lap2Event, q: float, orders: np.ndarray) -> np.ndarray:
        return bound(q, event.noise_multiplier, event.num_params, orders)

    rdp.__doc__ = bound.__doc__
    return rdp


PLUGIN = register_plugin(MechanismPlugin(
    mechanism=MechanismSpec(
        name="lap2",
        description="Lap2: per-example L2 clipping to C, i.i.d. Laplace noise on the sum",
        noise=LAPLACE_SCALE, perturbs="gradients", noise_distribution="laplace", clip_norm_ord=2,
        event=lap2_event, event_type=Lap2Event, needs_params=True, secure_noise="discrete-laplace",
        accountants=("lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"),
        audit_pair=AuditPair("laplace-spread"),
    ),
    rdp={"sound": _rdp(lap2_sound_rdp), "paper": _rdp(lap2_paper_rdp), "add-only": _rdp(lap2_add_only_rdp)},
    unsound_rdp=("paper", "add-only"),
    pld=PldRoute(loss_width=lambda event, q: gaussian_loss_width(dominating_noise_multiplier(event), q),
                 single_step=lambda event, q, grid: gaussian_pmfs(dominating_noise_multiplier(event), q, grid)),
    accountants=(
        AccountantSpec(
            "lap2-rdp", "lap2", True,
            "Sound L2-clipped Laplace RDP (docs/theory/lap2.md Sec. 4): one Bernoulli draw for all "
            "coordinates; per order min(max(add expansion, remove lemma), Zhu-Wang general) with "
            "base moments min(majorization sum, Gaussian domination).",
        ),
        AccountantSpec(
            "lap2-gdp", "lap2", True,
            "One Lap2 step is M_n-GDP (M_n < sqrt(pi/2) C/b; docs/theory/lap2.md Sec. 10), so the "
            f"Poisson-sampled Gaussian PLD at noise multiplier 1/M_n bounds it: {PLD_NOTE}.",
            kind="pld",
        ),
        AccountantSpec("lap2", "lap2", True, "The smaller of lap2-rdp and lap2-gdp, per delta (both sound).",
                       kind="minimum", routes=("lap2-rdp", "lap2-gdp")),
        AccountantSpec(
            "lap2-paper", "lap2", False,
            "The majorization accountant of Mohammady et al., \"Lap2: Revisiting Laplace DP-SGD for "
            "High Dimensions via Majorization Theory\", exactly as published (see "
            "docs/theory/lap2.md Sec. 3; Thm III.7).",
            warning="lap2-paper is the published Lap2 accountant, which is NOT a valid privacy bound "
            "in general: it subsamples each coordinate independently (docs/theory/lap2.md Sec. 3). "
            "Its epsilon can be below the true epsilon (e.g. 7.94 vs a proven lower bound of ~31.7 "
            "at b/C = 0.4 in the paper's MNIST setting). Use 'lap2' for a guarantee.",
            rdp_route="paper",
        ),
        AccountantSpec(
            "lap2-add-only", "lap2", False,
            "Lap2, add direction only (exact binomial expansion with the sound base moments).",
            warning="lap2-add-only bounds only the add direction D(mu||P0) of add/remove adjacency; "
            "it is not a guarantee for removal. Use 'lap2' for a guarantee.",
            rdp_route="add-only",
        ),
    ),
))


def calibrate_lap2(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    params: int,
    clip: float = 1.0,
    accountant: str = "lap2",
    compare: bool = True,
) -> CalibrationResult:
    """Lap2 paper, Algorithm 1: (C, b) for a target epsilon.

    Every Lap2 accountant depends on C and b through b / C only, so for any clipping norm C the
    smallest admissible b is C times one root (Brent on a log scale).  C itself is a utility choice
    (e.g. :func:`clip_from_gradient_norms` on public data).  The result holds the epsilon under
    every Lap2 accountant (sound ``lap2`` and the published ``lap2-paper``) side by side.
    """
    if get_spec(accountant).mechanism != "lap2":
        raise ValueError(f"accountant {accountant!r} is not a Lap2 accountant")
    return calibrate_noise(accountant, target_epsilon, delta, sample_rate, steps, clip=clip, params=params,
                           compare=compare)
