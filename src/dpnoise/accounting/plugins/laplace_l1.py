"""Laplace DP-SGD baseline: exact per-example L1 clipping to C, i.i.d. Laplace(b) noise on the sum.

The worst case of the L1 ball is a one-coordinate shift of C, so one step is the 1-D Laplace
mechanism at b / C: its PLD (pessimistic connect-the-dots) and the exact binomial RDP expansion.
"""

from __future__ import annotations

import numpy as np

from dpnoise.accounting.events import LaplaceEvent
from dpnoise.accounting.mechanisms import LAPLACE_SCALE, AuditPair, NoOptions, RunFacts, MechanismSpec
from dpnoise.accounting.pld.distribution import PldRoute, laplace_loss_width
from dpnoise.accounting.pld.single_step import laplace_pmfs
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin
from dpnoise.accounting.plugins.wording import pld_and_rdp
from dpnoise.accounting.rdp.laplace import sampled_laplace_rdp


def laplace_l1_event(noise: float, options: NoOptions, facts: RunFacts) -> LaplaceEvent:
    """b is absolute: the event's noise multiplier is b / C."""
    return LaplaceEvent(noise / facts.clip)


def add_remove_rdp(event: LaplaceEvent, q: float, orders: np.ndarray) -> np.ndarray:
    """The Poisson-sampled 1-D Laplace mechanism's RDP under add/remove adjacency."""
    return sampled_laplace_rdp(q, event.noise_multiplier, orders)


PLUGIN = register_plugin(MechanismPlugin(
    mechanism=MechanismSpec(
        name="laplace-l1",
        description="Laplace DP-SGD baseline: exact per-example L1 clipping to C, Laplace noise on the sum",
        noise=LAPLACE_SCALE, perturbs="gradients", noise_distribution="laplace", clip_norm_ord=1,
        event=laplace_l1_event, event_type=LaplaceEvent, secure_noise="discrete-laplace",
        accountants=("laplace-l1", "laplace-l1-pld", "laplace-l1-rdp"),
        audit_pair=AuditPair("laplace-shift"),
    ),
    rdp={"add-remove": add_remove_rdp},
    pld=PldRoute(loss_width=lambda event, q: laplace_loss_width(event.noise_multiplier, q),
                 single_step=lambda event, q, grid: laplace_pmfs(event.noise_multiplier, q, grid)),
    accountants=pld_and_rdp(
        "laplace-l1", "Poisson-sampled Laplace mechanism (L1 clipping: one-coordinate shift of C)",
        "Poisson-sampled Laplace with L1 clipping: exact binomial expansion of the 1-D shift "
        "at integer orders (Zhu & Wang 2019 tight form, which holds for Laplace)."),
))
