"""The PLD routes with their own single-step PMFs against independent references: dp_accounting's
pessimistic PLD composed by itself at delta 1e-5 (where its FFT round-off is harmless), and the exact
Gaussian-DP profile at q = 1 (Dong, Roth & Su, arXiv 1905.02383)."""

import math

import pytest

from dpnoise.accounting import get_accountant
from dpnoise.accounting.pld.gdp import lap2_gdp_mu

pld_lib = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
DELTA = 1e-5


def _dp_accounting(kind: str, noise: float, q: float, steps: int, grid: float = 1e-4) -> float:
    build = pld_lib.from_gaussian_mechanism if kind == "gaussian" else pld_lib.from_laplace_mechanism
    single = build(noise, pessimistic_estimate=True, value_discretization_interval=grid, sampling_prob=q)
    return single.self_compose(steps).get_epsilon_for_delta(DELTA)


@pytest.mark.parametrize("sigma,q,steps", [(1.1, 0.01, 2000), (0.8, 0.004, 10_000), (0.6, 0.05, 500)])
def test_gaussian_within_half_a_percent_of_dp_accounting(sigma, q, steps):
    ours = get_accountant("gaussian-pld").step(noise_multiplier=sigma, sample_rate=q, steps=steps).get_epsilon(DELTA)
    assert ours == pytest.approx(_dp_accounting("gaussian", sigma, q, steps), rel=5e-3)


@pytest.mark.parametrize("scale,q,steps", [(2.0, 0.01, 1000), (1.0, 0.05, 200)])
def test_laplace_l1_within_half_a_percent_of_dp_accounting(scale, q, steps):
    acc = get_accountant("laplace-l1-pld").step(laplace_scale=scale, clip=1.0, sample_rate=q, steps=steps)
    assert acc.get_epsilon(DELTA) == pytest.approx(_dp_accounting("laplace", scale, q, steps), rel=5e-3)


def test_lap2_within_half_a_percent_of_dp_accountings_gaussian_at_one_over_m_n():
    ratio, params, q, steps = 2.0, 100, 0.01, 1000
    acc = get_accountant("lap2-gdp").step(laplace_scale=ratio, clip=1.0, params=params, sample_rate=q, steps=steps)
    reference = _dp_accounting("gaussian", 1.0 / lap2_gdp_mu(ratio, params), q, steps)
    assert acc.get_epsilon(DELTA) == pytest.approx(reference, rel=5e-3)


def test_gaussian_at_q1_within_a_permille_of_exact_gdp():
    from scipy.optimize import brentq
    from scipy.special import ndtr

    mu = math.sqrt(10) / 2.0
    exact = brentq(lambda e: ndtr(-e / mu + mu / 2) - math.exp(e) * ndtr(-e / mu - mu / 2) - DELTA, 0.0, 50.0,
                   xtol=1e-12)
    ours = get_accountant("gaussian-pld").step(noise_multiplier=2.0, sample_rate=1.0, steps=10).get_epsilon(DELTA)
    assert exact <= ours <= exact * (1 + 1e-3)
