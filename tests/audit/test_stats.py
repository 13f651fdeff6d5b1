"""Clopper-Pearson, hypothesis-testing epsilon and one-run auditing statistics."""

import numpy as np
import pytest
from scipy.stats import binom

from dpnoise.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_from_rates,
    one_run_epsilon,
    one_run_p_value,
    threshold_audit,
)


def test_clopper_pearson_known_values():
    # 0 of 10: the one-sided 95% upper bound is 1 - 0.05^(1/10)
    assert clopper_pearson_upper(0, 10, 0.05) == pytest.approx(1 - 0.05 ** 0.1, rel=1e-12)
    # 10 of 10: lower bound 0.05^(1/10)
    assert clopper_pearson_lower(10, 10, 0.05) == pytest.approx(0.05 ** 0.1, rel=1e-12)
    # 5 of 10, two-sided 95% interval (tabulated): [0.187086, 0.812914]
    assert clopper_pearson_lower(5, 10, 0.025) == pytest.approx(0.187086, abs=1e-6)
    assert clopper_pearson_upper(5, 10, 0.025) == pytest.approx(0.812914, abs=1e-6)
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0 and clopper_pearson_lower(0, 10, 0.05) == 0.0


def test_clopper_pearson_is_the_binomial_tail_inversion():
    p = clopper_pearson_upper(7, 50, 0.05)
    assert binom.cdf(7, 50, p) == pytest.approx(0.05, rel=1e-9)


def test_epsilon_from_rates():
    # randomized response with eps = 1: FPR = FNR = 1/(1+e)
    r = 1 / (1 + np.e)
    assert epsilon_from_rates(r, r, 0.0) == pytest.approx(1.0)
    assert epsilon_from_rates(0.5, 0.5, 0.0) == 0.0
    assert epsilon_from_rates(0.6, 0.6, 1e-5) == 0.0


def test_threshold_audit_identical_distributions_gives_small_bound():
    rng = np.random.default_rng(0)
    res = threshold_audit(rng.normal(size=20000), rng.normal(size=20000), 1e-5)
    assert res.epsilon < 0.1


def test_one_run_p_value_reduces_to_binomial_without_delta():
    p = 1 / (1 + np.exp(-0.5))
    assert one_run_p_value(100, 40, 30, 0.5, 0.0) == pytest.approx(binom.sf(29, 40, p))


def test_one_run_epsilon():
    assert one_run_epsilon(1000, 100, 50, 1e-5) == 0.0  # chance level proves nothing
    perfect = one_run_epsilon(1000, 100, 100, 1e-5)
    good = one_run_epsilon(1000, 100, 90, 1e-5)
    assert perfect > good > 0.5
    # the bound is the largest eps whose p-value is still <= 5%
    assert one_run_p_value(1000, 100, 90, good, 1e-5) == pytest.approx(0.05, abs=1e-4)
