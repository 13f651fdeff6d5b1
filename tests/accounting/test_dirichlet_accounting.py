"""Dirichlet accountant and r* calibration (docs/theory/dirichlet.md §1-3)."""

import numpy as np
import pytest
from scipy.special import gammaln

from dpnoise.accounting import UnreachableTargetError, calibrate_dirichlet_r, steps_from_epochs
from dpnoise.accounting.rdp.dirichlet import exact_vertex_rdp, ponnoprat_rdp, sampled_dirichlet_rdp
from dpnoise.accounting.rdp.orders import INTEGER_ORDERS


def test_exact_vertex_sanity_value():
    assert exact_vertex_rdp(0.5, 1.0, np.array([2.0]))[0] == pytest.approx(np.log(2), rel=1e-12)


def _renyi_dirichlet(a_vec, b_vec, lam):
    """D_lam(Dir(a)||Dir(b)) from the multivariate Beta formula (docs/theory/dirichlet.md §1)."""
    log_beta = lambda v: gammaln(v).sum() - gammaln(v.sum())  # noqa: E731
    mix = lam * a_vec + (1 - lam) * b_vec
    return (log_beta(mix) - lam * log_beta(a_vec) - (1 - lam) * log_beta(b_vec)) / (lam - 1)


@pytest.mark.parametrize("r,alpha", [(0.3, 1.0), (0.1, 0.5), (2.0, 10.0)])
def test_exact_vertex_is_the_vertex_divergence_and_below_ponnoprat(r, alpha):
    orders = np.arange(2, int(1 + alpha / r) + 1, dtype=float)
    orders = orders[orders < 1 + alpha / r]
    e1, e2 = np.array([1.0, 0, 0]), np.array([0, 1.0, 0])
    direct = [_renyi_dirichlet(r * e1 + alpha, r * e2 + alpha, lam) for lam in orders]
    np.testing.assert_allclose(exact_vertex_rdp(r, alpha, orders), direct, rtol=1e-10)
    assert np.all(exact_vertex_rdp(r, alpha, orders) <= ponnoprat_rdp(r, alpha, orders))


def test_inadmissible_orders_are_infinite():
    rdp = sampled_dirichlet_rdp(0.01, 0.3, 1.0, INTEGER_ORDERS)
    assert np.all(np.isfinite(rdp[INTEGER_ORDERS < 1 + 1 / 0.3]))
    assert np.all(np.isinf(rdp[INTEGER_ORDERS >= 1 + 1 / 0.3]))


def test_general_subsampling_bound_is_above_tight_form():
    general = sampled_dirichlet_rdp(0.01, 0.05, 1.0, INTEGER_ORDERS)
    tight = sampled_dirichlet_rdp(0.01, 0.05, 1.0, INTEGER_ORDERS, subsampling="tight")
    finite = np.isfinite(general)
    assert np.all(general[finite] >= tight[finite])


@pytest.mark.parametrize("target,base,expected", [(4.0, "dirichlet-ponnoprat", 0.248), (1.0, "dirichlet-ponnoprat", 0.0953),
                                                   (4.0, "dirichlet", 0.333), (1.0, "dirichlet", 0.111)])
def test_calibration_reproduces_spec_examples(target, base, expected):
    q = 256 / 50000
    result = calibrate_dirichlet_r(target, 1e-5, q, steps_from_epochs(30, q), alpha=1.0, accountant=base)
    assert result.noise == pytest.approx(expected, abs=6e-4)
    assert result.epsilon <= target


def test_floor_is_reported_as_unreachable():
    q = 0.02048
    with pytest.raises(UnreachableTargetError, match=r"floor of epsilon=1\.8"):
        calibrate_dirichlet_r(1.0, 1e-5, q, steps_from_epochs(100, q))
