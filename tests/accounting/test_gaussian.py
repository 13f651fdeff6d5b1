"""Sampled Gaussian RDP vs Opacus, dp_accounting and high-precision quadrature."""

import mpmath as mp
import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
from dp_accounting.rdp import RdpAccountant as DpaRdpAccountant

from dpnoise.accounting.rdp.gaussian import gaussian_base_log_moments, sampled_gaussian_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.accounting.rdp.subsampling import log_moment_add_direction, log_moment_zhu_wang_general

GRID = [(q, s) for q in (1e-3, 0.0043, 0.01, 0.1, 0.5, 1.0) for s in (0.4, 0.8, 1.5, 5.0)]


@pytest.mark.parametrize("q,sigma", GRID)
def test_matches_opacus_compute_rdp(q, sigma):
    compute_rdp = pytest.importorskip("opacus.accountants.analysis.rdp").compute_rdp
    ours = sampled_gaussian_rdp(q, sigma, DEFAULT_ORDERS)
    theirs = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(DEFAULT_ORDERS))
    # atol: below ~1e-7 Opacus's fractional-order series loses digits to cancellation (ours is
    # checked against 40-digit quadrature in test_matches_quadrature_for_tiny_rdp).
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-13)


@pytest.mark.parametrize("q,sigma", GRID[::3])
def test_matches_dp_accounting(q, sigma):
    """Equal at integer orders; at fractional orders dp_accounting 0.6 reports larger values
    (ours match 40-digit quadrature there, see test_matches_quadrature_for_tiny_rdp)."""
    acc = DpaRdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), 7)
    ours = 7 * sampled_gaussian_rdp(q, sigma, DEFAULT_ORDERS)
    ints = DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)
    np.testing.assert_allclose(ours[ints], acc._rdp[ints], rtol=1e-6)
    assert np.all(acc._rdp[~ints] >= ours[~ints] * (1 - 1e-6))


@pytest.mark.parametrize("q,s,order", [(1e-5, 0.5, 1.1), (1e-5, 0.5, 1.5), (1e-5, 0.5, 2.0), (1e-5, 0.5, 3.7), (1e-3, 5.0, 1.1), (1e-3, 0.4, 1.1), (1e-3, 0.4, 2.1)])
def test_matches_quadrature_for_tiny_rdp(q, s, order):
    """Where Opacus loses digits to cancellation, ours agrees with 40-digit quadrature."""
    mp.mp.dps = 40

    def integrand(z):
        p0, p1 = mp.npdf(z, 0, s), mp.npdf(z, 1, s)
        return ((1 - q) * p0 + q * p1) ** order * p0 ** (1 - order)

    exact = float(mp.log(mp.quad(integrand, [-mp.inf, 0, 0.5, 1, mp.inf])) / (order - 1))
    assert sampled_gaussian_rdp(q, s, np.array([order]))[0] == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("q,sigma", [(0.0043, 0.7), (0.05, 1.1), (0.3, 2.0)])
def test_zhu_wang_tight_form_reproduces_sampled_gaussian(q, sigma):
    """Zhu & Wang's tight form with eps(l) = l / (2 sigma^2) is Mironov et al.'s exact RDP (Opacus)."""
    compute_rdp = pytest.importorskip("opacus.accountants.analysis.rdp").compute_rdp
    orders = np.arange(2, 257, dtype=float)
    tight = log_moment_add_direction(q, orders, gaussian_base_log_moments(sigma, 256)) / (orders - 1)
    reference = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders))
    np.testing.assert_allclose(tight, reference, rtol=1e-10)
    general = log_moment_zhu_wang_general(q, orders, gaussian_base_log_moments(sigma, 256)) / (orders - 1)
    assert np.all(general >= tight * (1 - 1e-12))
