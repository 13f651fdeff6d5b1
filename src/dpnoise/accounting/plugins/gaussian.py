"""DP-SGD: per-example L2 clipping to C, Gaussian noise of std sigma C on the sum (add/remove adjacency).

Accounted by the PLD of the Poisson-sampled Gaussian (pessimistic connect-the-dots, arXiv 2207.04380) and by the sampled Gaussian RDP
(Mironov, Talwar & Zhang, arXiv 1908.10530), the default being the smaller per delta.
"""

from __future__ import annotations

import numpy as np

from dpnoise.accounting.calibration import CalibrationResult, calibrate_noise
from dpnoise.accounting.events import GaussianEvent
from dpnoise.accounting.mechanisms import NOISE_MULTIPLIER, AuditPair, NoOptions, RunFacts, MechanismSpec
from dpnoise.accounting.pld.distribution import PldRoute, gaussian_loss_width
from dpnoise.accounting.pld.single_step import gaussian_pmfs
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin
from dpnoise.accounting.plugins.wording import pld_and_rdp
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.release_count import LogProfile, gaussian_log_profile


def gaussian_event(noise: float, options: NoOptions, facts: RunFacts) -> GaussianEvent:
    """sigma is already relative to C."""
    return GaussianEvent(noise)


def releases_log_profile(event: GaussianEvent) -> LogProfile:
    """k Gaussian releases of noise multiplier s are (sqrt(k) / s)-GDP (Dong, Roth & Su, arXiv 1905.02383,
    Cor. 3.3): their profile is exact (:func:`~dpnoise.accounting.release_count.gaussian_log_profile`)."""
    mu = 1.0 / event.noise_multiplier
    return lambda epsilon, counts: gaussian_log_profile(epsilon, np.sqrt(counts) * mu)


def add_remove_rdp(event: GaussianEvent, q: float, orders: np.ndarray) -> np.ndarray:
    """The sampled Gaussian mechanism's RDP under add/remove adjacency."""
    return sampled_gaussian_rdp(q, event.noise_multiplier, orders)


PLUGIN = register_plugin(MechanismPlugin(
    mechanism=MechanismSpec(
        name="gaussian",
        description="DP-SGD: per-example L2 clipping to C, Gaussian noise on the sum",
        noise=NOISE_MULTIPLIER, perturbs="gradients", noise_distribution="gaussian", clip_norm_ord=2,
        event=gaussian_event, event_type=GaussianEvent, secure_noise="discrete-gaussian",
        accountants=("gaussian", "gaussian-pld", "gaussian-rdp"),
        audit_pair=AuditPair("gaussian-shift"),
    ),
    rdp={"add-remove": add_remove_rdp},
    pld=PldRoute(loss_width=lambda event, q: gaussian_loss_width(event.noise_multiplier, q),
                 single_step=lambda event, q, grid: gaussian_pmfs(event.noise_multiplier, q, grid)),
    release_profile=releases_log_profile,
    accountants=pld_and_rdp(
        "gaussian", "Poisson-sampled Gaussian mechanism",
        "Sampled Gaussian mechanism RDP (Mironov, Talwar, Zhang 2019, arXiv 1908.10530); exact at integer orders."),
))


def calibrate_gaussian_sigma(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> CalibrationResult:
    """Smallest noise multiplier sigma of DP-SGD reaching (target_epsilon, delta)."""
    return calibrate_noise("gaussian", target_epsilon, delta, sample_rate, steps)
