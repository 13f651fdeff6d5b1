"""A mechanism added as a contributor would, in one module: its noise unit, its options (a side parameter),
its event, its RDP and PLD routes, its spec and its accountants in one :class:`MechanismPlugin`, and its
noise sampler (registered by the tests that use it, :func:`registered`).

The toy is DP-SGD's Gaussian mechanism with a noise unit of its own, the absolute std s of the noise on
the sum of L2-clipped gradients (``toy_std``), and a side parameter of its own, ``group_size`` k: the
number of examples one privacy unit contributes, so that the sum's sensitivity is k C.  Its event is the
Gaussian's at noise multiplier s / (k C), accounted by its own routes: every number it gives must be the
Gaussian's at that multiplier, which the tests check layer by layer (accountants, command line,
calibration, audit, training engine).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from dpnoise.accounting import AccountantSpec, MechanismPlugin, MechanismSpec, register_plugin, unregister_plugin
from dpnoise.accounting.mechanisms import AuditPair, MechanismOptions, NoiseParameter, RunFacts, side_option
from dpnoise.accounting.pld.distribution import PldRoute, gaussian_loss_width
from dpnoise.accounting.pld.single_step import gaussian_pmfs
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.validation import check_count, check_positive

TOY_STD = NoiseParameter("toy_std", "absolute std s of the Gaussian noise on the sum (privacy depends on s / C)",
                         per_clip=True)


@dataclass(frozen=True, kw_only=True)
class ToyOptions(MechanismOptions):
    """The toy's side parameter."""

    group_size: int = side_option(1, help="examples per privacy unit k: the sum's sensitivity is k C (default 1)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_size", check_count("group_size", self.group_size, 1))


@dataclass(frozen=True)
class ToyEvent:
    """Gaussian noise of std ``noise_multiplier`` at sensitivity 1."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)


def toy_event(noise: float, options: ToyOptions, facts: RunFacts) -> ToyEvent:
    return ToyEvent(noise / (options.group_size * facts.clip))


def toy_rdp(event: ToyEvent, q: float, orders: np.ndarray) -> np.ndarray:
    return sampled_gaussian_rdp(q, event.noise_multiplier, orders)


PLUGIN = MechanismPlugin(
    mechanism=MechanismSpec(
        name="toy", description="The Gaussian mechanism in a unit of its own, for groups of k examples",
        noise=TOY_STD, options=ToyOptions, perturbs="gradients", noise_distribution="gaussian", clip_norm_ord=2,
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


def toy_noise(reference, noise, clip, generator, shares):
    """The toy's torch side: Gaussian noise of std ``noise`` (absolute), whatever the clip."""
    from dpnoise.mechanisms.noise import gaussian_noise

    return gaussian_noise(reference, noise / clip, clip, generator, shares)


@contextmanager
def registered():
    """The toy mechanism registered (one call) with its noise sampler, and every registry as it was afterwards."""
    from dpnoise.mechanisms import implement_mechanism, unimplement_mechanism

    register_plugin(PLUGIN)
    implement_mechanism("toy", sample_noise=toy_noise)
    try:
        yield PLUGIN
    finally:
        unimplement_mechanism("toy")
        unregister_plugin(PLUGIN)
