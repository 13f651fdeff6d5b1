"""Mironov's floating-point distinguisher: it breaks the float samplers and finds nothing against the secure ones."""

import numpy as np
import pytest
import torch

from dpnoise.accounting.secure_noise import plan_discrete_gaussian, plan_discrete_laplace
from dpnoise.audit.floating_point import audit_floating_point, grid_escape, lowest_bit_parity, rate_epsilon
from dpnoise.mechanisms.noise import gaussian_noise, laplace_noise
from dpnoise.mechanisms.secure_noise import Shake256RandomBits, secure_noisy_sum

TRIALS = 20_000


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lemma_sums_below_the_input_lie_on_its_half_ulp_grid(dtype):
    """|fl(c + n)| < |c| implies fl(c + n) in (ulp(c)/2) Z, for floats n of every magnitude."""
    rng = np.random.default_rng(0)
    c = (rng.uniform(0.5, 1.0, 200_000) * 2.0 ** rng.integers(-20, 20, 200_000)).astype(dtype)
    c *= rng.choice([-1, 1], c.size).astype(dtype)
    n = (rng.standard_normal(c.size) * np.abs(c) * 2.0 ** rng.integers(-30, 3, c.size)).astype(dtype)
    y = c + n
    below = np.abs(y) < np.abs(c)
    assert below.sum() > 40_000
    assert np.all(np.fmod(y[below], np.spacing(np.abs(c[below])) / 2) == 0)
    shift = c[:1]
    same_shift = (shift + n[:, None]).astype(dtype)
    assert not grid_escape(same_shift, shift).any()
    assert grid_escape(n[:, None], shift).any()  # the noise alone does leave the grid


def test_lowest_bit_parity_reads_the_exponent_of_the_lowest_set_bit():
    values = np.array([[1.0], [2.0], [3.0 * 2.0 ** -7], [0.0], [-6.0], [2.0 ** -1074]])
    assert lowest_bit_parity(values, np.array([1.0])).tolist() == [False, True, True, False, True, False]
    single = values.astype(np.float32)[:5]
    assert lowest_bit_parity(single, np.array([1.0])).tolist() == [False, True, True, False, True]


def test_rate_bound_is_zero_without_evidence_and_large_with_it():
    assert rate_epsilon(0, 0, 1000, 1e-5, 0.01) == 0.0
    assert rate_epsilon(500, 480, 1000, 1e-5, 0.01) == 0.0
    assert rate_epsilon(900, 0, 10_000, 1e-5, 0.01) == pytest.approx(rate_epsilon(0, 900, 10_000, 1e-5, 0.01))
    assert rate_epsilon(900, 0, 10_000, 1e-5, 0.01) > 5


@pytest.mark.parametrize("mechanism, dim, dtype", [("laplace-l1", 1, torch.float64), ("lap2", 16, torch.float32),
                                                   ("gaussian", 4, torch.float64)])
def test_float_samplers_are_told_apart_far_beyond_their_epsilon(mechanism, dim, dtype):
    generator = torch.Generator().manual_seed(1)
    sampler = gaussian_noise if mechanism == "gaussian" else laplace_noise
    result = audit_floating_point(lambda s: s + sampler(s, 1.0, 1.0, generator), mechanism, 1.0, dim=dim,
                                  trials=TRIALS, dtype=dtype)
    escape = result["distinguishers"]["grid_escape"]
    assert escape["hits_with"] == 0  # the lemma: impossible from the shifted input
    assert escape["hits_without"] > 0.1 * TRIALS
    assert not result["consistent"]
    assert result["lower_bound_epsilon"] > 1.5 * result["claimed_epsilon"]


@pytest.mark.parametrize("mechanism, dim, dtype", [("laplace-l1", 1, torch.float64), ("lap2", 16, torch.float32),
                                                   ("gaussian", 4, torch.float64)])
def test_secure_samplers_give_the_distinguishers_nothing(mechanism, dim, dtype):
    bits = Shake256RandomBits(bytes(32))
    plan = (plan_discrete_gaussian(1.0, 1.0, dim) if mechanism == "gaussian"
            else plan_discrete_laplace(1.0, 1.0, dim, 1 if mechanism == "laplace-l1" else 2))
    result = audit_floating_point(lambda s: secure_noisy_sum(s, plan, bits), mechanism, 1.0, dim=dim,
                                  trials=TRIALS, dtype=dtype)
    assert result["consistent"]
    assert result["distinguishers"]["grid_escape"]["hits_without"] == 0
    parity = result["distinguishers"]["lowest_bit_parity"]
    assert min(parity["hits_without"], parity["hits_with"]) > 0.2 * TRIALS  # a live statistic, equal on both sides
    assert result["lower_bound_epsilon"] <= result["claimed_epsilon"]


def test_audit_refuses_output_mechanisms():
    with pytest.raises(ValueError, match="floating-point audit supports"):
        audit_floating_point(lambda s: s, "dirichlet", 1.0)
