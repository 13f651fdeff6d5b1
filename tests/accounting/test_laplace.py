"""Laplace moments and the Laplace-L1 accountant vs mpmath, autodp and dp_accounting's PLD."""

import mpmath as mp
import numpy as np
import pytest
from dp_accounting import LaplaceDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.pld import PLDAccountant

from dpnoise.accounting import get_accountant
from dpnoise.accounting.rdp.laplace import (
    log_laplace_moment,
    log_laplace_moment_excess,
    sampled_laplace_rdp,
)

# test-only library: without it this module is skipped (dpnoise.accounting itself does not need it)
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
given, settings = hypothesis.given, hypothesis.settings


@pytest.mark.parametrize("t", [1e-9, 1e-5, 0.01, 0.3, 1.0, 4.0, 20.0])
@pytest.mark.parametrize("eta", [2, 3, 10, 64, 256])
def test_log_moment_matches_mpmath(t, eta):
    mp.mp.dps = 50
    tt = mp.mpf(t)
    f = (eta * mp.exp((eta - 1) * tt) + (eta - 1) * mp.exp(-eta * tt)) / (2 * eta - 1)
    assert float(log_laplace_moment_excess(t, eta)) == pytest.approx(float(mp.log(f - 1)), rel=1e-12)
    assert float(log_laplace_moment(t, eta)) == pytest.approx(float(mp.log(f)), rel=1e-12)


def test_moment_is_trivial_at_orders_zero_and_one():
    assert np.all(log_laplace_moment(np.array([0.0, 0.5, 3.0]), 0) == 0)
    assert np.all(log_laplace_moment(np.array([0.0, 0.5, 3.0]), 1) == 0)


@settings(max_examples=200, deadline=None)
@given(t=st.floats(0, 30), eta=st.integers(2, 256))
def test_gaussian_domination(t, eta):
    """docs/theory/lap2.md §4 (b): log F(u, eta) <= eta (eta-1) t^2 / 2."""
    assert log_laplace_moment(t, eta) <= eta * (eta - 1) * t * t / 2 * (1 + 1e-12) + 1e-300


@pytest.mark.parametrize("q,b", [(0.01, 1.0), (0.0043, 0.5), (0.1, 2.0), (0.5, 3.0)])
def test_matches_autodp_exact_subsampled_laplace(q, b):
    """autodp's Poisson amplification with improved_bound_flag (the tight form) for Laplace."""
    LaplaceMechanism = pytest.importorskip("autodp.mechanism_zoo").LaplaceMechanism
    AmplificationBySampling = pytest.importorskip("autodp.transformer_zoo").AmplificationBySampling
    sub = AmplificationBySampling(PoissonSampling=True)(LaplaceMechanism(b=b), q, improved_bound_flag=True)
    orders = np.arange(2, 48, dtype=float)
    theirs = np.array([sub.RenyiDP(a) for a in orders])
    np.testing.assert_allclose(sampled_laplace_rdp(q, b, orders), theirs, rtol=1e-9)


@pytest.mark.parametrize("q,b,steps", [(0.01, 1.0, 1000), (0.0043, 2.0, 5860), (0.1, 4.0, 200)])
def test_upper_bounds_dp_accounting_pld(q, b, steps):
    pld = PLDAccountant()
    pld.compose(SelfComposedDpEvent(PoissonSampledDpEvent(q, LaplaceDpEvent(b)), steps))
    rdp = get_accountant("laplace-l1-rdp").step(laplace_scale=b, sample_rate=q, clip=1.0, steps=steps).get_epsilon(1e-5)
    default = get_accountant("laplace-l1").step(laplace_scale=b, sample_rate=q, clip=1.0, steps=steps).get_epsilon(1e-5)
    theirs = pld.get_epsilon(1e-5)
    assert rdp >= theirs
    assert rdp <= 1.6 * theirs + 0.05  # RDP is looser than PLD, but not wildly
    # The default is a pessimistic PLD on grids refined until epsilon converges: within 0.5% of theirs
    # (a pessimistic 1e-4 grid) and never below the optimistic PLD's lower bound.
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    lower = pld_lib.from_laplace_mechanism(b, pessimistic_estimate=False, value_discretization_interval=1e-4,
                                           sampling_prob=q, use_connect_dots=False).self_compose(steps)
    assert lower.get_epsilon_for_delta(1e-5) <= default <= theirs * 1.005 + 1e-4
