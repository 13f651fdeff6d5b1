"""Penultimate-layer Gaussian (Monir & Ghinita 2024, reconstructed; docs/theory/dirichlet.md Sec. 6):
each selected example's penultimate activation, clipped to norm C, gets N(0, sigma^2 C^2) and is
released.  Replacing the private input moves a clipped activation by up to 2C, so its event is the
Gaussian event at the sensitivity-1 noise multiplier sigma / 2, accounted under replace-one adjacency
(the example's inclusion visible): its own RDP route of that event, and the exact release-count
profile.  The add/remove readings (the Gaussian event's default routes) are flagged unsound.
"""

from __future__ import annotations

import numpy as np

from dpnoise.accounting.events import GaussianEvent
from dpnoise.accounting.mechanisms import NOISE_MULTIPLIER, OUTPUT_PRIVACY_SCOPE, AuditPair, NoOptions, RunFacts, MechanismSpec
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin
from dpnoise.accounting.plugins.wording import PLD_NOTE, add_remove_reading
from dpnoise.accounting.rdp.gaussian import shared_inclusion_gaussian_rdp
from dpnoise.accounting.registry import AccountantSpec


def penultimate_gaussian_event(noise: float, options: NoOptions, facts: RunFacts) -> GaussianEvent:
    """The sensitivity-1 noise multiplier is sigma / 2 (a replaced input moves the activation by up to 2C)."""
    return GaussianEvent(noise / 2.0)


def replace_one_rdp(event: GaussianEvent, q: float, orders: np.ndarray) -> np.ndarray:
    """Each sampled example's own Gaussian release, replace-one adjacency, its inclusion visible."""
    return shared_inclusion_gaussian_rdp(q, event.noise_multiplier, orders)


_MECHANISM = "penultimate-layer Gaussian"

PLUGIN = register_plugin(MechanismPlugin(
    mechanism=MechanismSpec(
        name="penultimate-gaussian",
        description="Penultimate-layer Gaussian (Monir & Ghinita, reconstructed): clip activations to C, "
        "add N(0, sigma^2 C^2)",
        noise=NOISE_MULTIPLIER, perturbs="outputs", noise_distribution="gaussian",
        event=penultimate_gaussian_event, event_type=GaussianEvent,
        accountants=("penultimate-gaussian", "penultimate-gaussian-exact", "penultimate-gaussian-replace-one-rdp",
                     "penultimate-gaussian-pld"),
        audit_pair=AuditPair("gaussian-shift"),
        scope=OUTPUT_PRIVACY_SCOPE,
    ),
    rdp={"replace-one": replace_one_rdp},
    accountants=(
        AccountantSpec(
            "penultimate-gaussian-exact", "penultimate-gaussian", True,
            "Gaussian noise on per-example clipped penultimate activations, replace-one adjacency, each "
            "sampled example's noisy activation released: the exact privacy profile, sum_k Bin(k; T, q) "
            "delta_k(eps) with delta_k that of sqrt(k) mu-GDP, mu = 2 / sigma (docs/theory/dirichlet.md "
            "Sec. 2.4). One repeated release only (else +inf).",
            kind="release-count",
        ),
        AccountantSpec(
            "penultimate-gaussian-replace-one-rdp", "penultimate-gaussian", True,
            "Gaussian noise on per-example clipped penultimate activations (reconstruction of Monir & "
            "Ghinita 2024, docs/theory/dirichlet.md Sec. 6), replace-one adjacency, each sampled "
            "example's noisy activation released: Gaussian RDP at multiplier sigma/2 (input replacement "
            "moves a clipped activation by up to 2C), subsampled exactly as log(1 - q + q e^{(a-1) eps(a)}) "
            "/ (a-1) (the example's inclusion is visible). RDP only.",
            rdp_route="replace-one",
        ),
        AccountantSpec(
            "penultimate-gaussian", "penultimate-gaussian", True,
            "The smaller of penultimate-gaussian-exact and penultimate-gaussian-replace-one-rdp, per delta "
            "(both sound; replace-one adjacency, each sampled example's noisy activation released).",
            kind="minimum", routes=("penultimate-gaussian-exact", "penultimate-gaussian-replace-one-rdp"),
        ),
        AccountantSpec(
            "penultimate-gaussian-pld", "penultimate-gaussian", False,
            f"Poisson-sampled Gaussian PLD (add/remove) at noise multiplier sigma/2: {PLD_NOTE}.",
            warning=add_remove_reading("penultimate-gaussian-pld", _MECHANISM, "penultimate-gaussian"),
            kind="pld",
        ),
        AccountantSpec(
            "penultimate-gaussian-rdp", "penultimate-gaussian", False,
            "Sampled Gaussian RDP (add/remove) at noise multiplier sigma/2.",
            warning=add_remove_reading("penultimate-gaussian-rdp", _MECHANISM, "penultimate-gaussian"),
        ),
    ),
))
