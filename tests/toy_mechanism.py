"""A mechanism added as a contributor would, in one module: its event, its RDP and PLD routes, its
spec and its accountants in one :class:`MechanismPlugin` (registered by the tests that use it,
:func:`registered`).

The toy is DP-SGD's Gaussian mechanism (std sigma C on the sum of L2-clipped gradients) under its own
name and event type, accounted by its own routes: every number it gives must be the Gaussian's, which
the tests check layer by layer (accountants, command line, calibration, audit, training engine).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from dpnoise.accounting import AccountantSpec, MechanismPlugin, MechanismSpec, register_plugin, unregister_plugin
from dpnoise.accounting.mechanisms import NOISE_MULTIPLIER, AuditPair, EventContext
from dpnoise.accounting.pld.distribution import PldRoute, gaussian_loss_width
from dpnoise.accounting.pld.single_step import gaussian_pmfs
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.validation import check_positive


@dataclass(frozen=True)
class ToyEvent:
    """Gaussian noise of std ``noise_multiplier`` at sensitivity 1."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)


def toy_event(noise: float, context: EventContext) -> ToyEvent:
    return ToyEvent(check_positive("noise_multiplier", noise))


def toy_rdp(event: ToyEvent, q: float, orders: np.ndarray) -> np.ndarray:
    return sampled_gaussian_rdp(q, event.noise_multiplier, orders)


PLUGIN = MechanismPlugin(
    mechanism=MechanismSpec(
        name="toy", description="The Gaussian mechanism under its own name and event type",
        noise=NOISE_MULTIPLIER, perturbs="gradients", noise_distribution="gaussian", clip_norm_ord=2,
        event=toy_event, event_type=ToyEvent, accountants=("toy", "toy-pld", "toy-rdp"),
        audit_pair=AuditPair("gaussian-shift"),
    ),
    rdp={"add-remove": toy_rdp},
    pld=PldRoute(loss_width=lambda event, q: gaussian_loss_width(event.noise_multiplier, q),
                 single_step=lambda event, q, grid: gaussian_pmfs(event.noise_multiplier, q, grid)),
    accountants=(
        AccountantSpec("toy-pld", "toy", True, "The toy's sampled Gaussian PLD.", kind="pld"),
        AccountantSpec("toy-rdp", "toy", True, "The toy's sampled Gaussian RDP."),
        AccountantSpec("toy-rdp-unsound", "toy", False, "The toy's RDP, flagged unsound.",
                       warning="toy-rdp-unsound is flagged unsound to exercise the warning."),
        AccountantSpec("toy", "toy", True, "The smaller of toy-pld and toy-rdp.", kind="minimum",
                       routes=("toy-pld", "toy-rdp")),
    ),
)

#: the toy's accountants in the order the registry lists them (a minimum before its routes)
ACCOUNTANT_NAMES = ("toy", "toy-pld", "toy-rdp", "toy-rdp-unsound")


@contextmanager
def registered():
    """The toy mechanism registered (one call), and every registry as it was afterwards."""
    register_plugin(PLUGIN)
    try:
        yield PLUGIN
    finally:
        unregister_plugin(PLUGIN)
