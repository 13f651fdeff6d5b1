"""Secure samplers: exact laws (chi-square against the exact pmf), releases on the grid, refusals."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from dpnoise.accounting.secure_noise import plan_discrete_gaussian, plan_discrete_laplace
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.mechanisms import secure_noise
from dpnoise.mechanisms.secure_noise import (
    SecureNoiseError,
    Shake256RandomBits,
    SystemRandomBits,
    bernoulli_exp,
    bernoulli_rational,
    discrete_gaussian,
    discrete_laplace,
    floored_laplace,
    geometric,
    secure_gaussian_sum,
    secure_laplace_sum,
    secure_noisy_sum,
)


def bits(seed: int) -> Shake256RandomBits:
    return Shake256RandomBits(seed.to_bytes(32, "little"))


def assert_law(sample: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> None:
    """Chi-square of ``sample`` against ``pmf`` on ``support`` (tail mass merged into the end bins);
    every draw must lie in the support's range or a tail bin."""
    pmf = pmf / pmf.sum()
    counts = np.array([np.sum(sample == v) for v in support], dtype=float)
    expected = pmf * len(sample)
    low, high = np.sum(sample < support[0]), np.sum(sample > support[-1])
    keep = expected >= 5
    observed = np.append(counts[keep], counts[~keep].sum() + low + high)
    wanted = np.append(expected[keep], len(sample) - expected[keep].sum())
    assert stats.chisquare(observed, wanted).pvalue > 1e-4


def binomial_ok(hits: int, trials: int, p: float) -> bool:
    return abs(hits - trials * p) <= 5 * math.sqrt(trials * p * (1 - p)) + 1


@pytest.mark.parametrize("numerator, denominator", [(0, 7), (3, 7), (7, 7), (1, 2 ** 54 - 1), (2 ** 53, 2 ** 54 + 3)])
def test_rational_bernoulli_has_its_exact_probability(numerator, denominator):
    n = 100_000
    draws = bernoulli_rational(bits(1), torch.full((n,), numerator), denominator)
    p = numerator / denominator
    assert binomial_ok(int(draws.sum()), n, p)
    if p in (0.0, 1.0):
        assert bool((draws == bool(p)).all())


def test_rational_bernoulli_takes_elementwise_denominators():
    num = torch.tensor([1, 2, 3] * 30_000)
    den = torch.tensor([2, 5, 3] * 30_000)
    draws = bernoulli_rational(bits(2), num, den).view(-1, 3).double().mean(0).numpy()
    assert np.allclose(draws, [0.5, 0.4, 1.0], atol=0.01) and draws[2] == 1.0


@pytest.mark.parametrize("whole, numerator, denominator", [(0, 0, 5), (0, 3, 10), (0, 1, 1), (2, 1, 3), (4, 0, 1)])
def test_exponential_bernoulli_has_its_exact_probability(whole, numerator, denominator):
    n = 100_000
    draws = bernoulli_exp(bits(3), torch.full((n,), whole), torch.full((n,), numerator), denominator)
    assert binomial_ok(int(draws.sum()), n, math.exp(-(whole + numerator / denominator)))


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_geometric_follows_exp_minus_x_over_t(steps):
    sample = geometric(bits(4), 60_000, steps).numpy()
    support = np.arange(0, 30 * steps)
    assert sample.min() >= 0
    assert_law(sample, support, np.exp(-support / steps))


def test_floored_laplace_is_the_floor_of_a_continuous_laplace():
    t = 3
    sample = floored_laplace(bits(5), 80_000, t).numpy()
    support = np.arange(-40, 40)
    pmf = stats.laplace(scale=t).cdf(support + 1) - stats.laplace(scale=t).cdf(support)  # P(floor L = j)
    assert_law(sample, support, pmf)
    assert np.mean(sample) == pytest.approx(-0.5, abs=0.1)  # floor(L) has mean -1/2


def test_discrete_laplace_follows_exp_minus_abs_y_over_t():
    t = 2
    sample = discrete_laplace(bits(6), 60_000, t).numpy()
    support = np.arange(-30, 31)
    assert_law(sample, support, np.exp(-np.abs(support) / t))


@pytest.mark.parametrize("steps, width", [(1, 1), (3, 2), (7, 7)])
def test_discrete_gaussian_follows_exp_minus_y2_over_2_sigma2(steps, width):
    sample = discrete_gaussian(bits(7), 60_000, steps, width).numpy()
    variance = steps * width
    support = np.arange(-12 * math.isqrt(variance) - 12, 12 * math.isqrt(variance) + 13)
    assert_law(sample, support, np.exp(-support.astype(float) ** 2 / (2 * variance)))


def test_discrete_gaussian_squares_large_offsets_exactly(monkeypatch):
    """The Python-integer branch (|u| >= SQUARE_LIMIT, rare at real sizes) gives the same law."""
    monkeypatch.setattr(secure_noise, "SQUARE_LIMIT", 2)
    sample = discrete_gaussian(bits(8), 20_000, 3, 2).numpy()
    support = np.arange(-40, 41)
    assert_law(sample, support, np.exp(-support.astype(float) ** 2 / 12))


def test_large_scales_keep_their_spread():
    t = 2 ** 23
    gaussian = discrete_gaussian(bits(9), 20_000, t, t).double() / t
    assert stats.kstest(gaussian.numpy(), "norm").pvalue > 1e-4
    for t in (2 ** 23, 3 * 2 ** 34 + 7):  # the second draws its uniforms by masking (bound > 2^31)
        laplace = floored_laplace(bits(10), 20_000, t).double() / t
        assert stats.kstest(laplace.numpy(), stats.laplace().cdf).pvalue > 1e-4


@pytest.mark.parametrize("bound", [1, 7, 2 ** 31, 2 ** 33 + 5, 2 ** 55 - 1])
def test_uniform_integers_are_exact_on_both_branches(bound):
    draws = secure_noise._uniform_below(bits(19), 40_000, bound)
    assert int(draws.min()) >= 0 and int(draws.max()) < bound
    bins = min(bound, 10)  # every value (small bounds) or 10 equal-width bins
    if bins > 1:
        counts = np.bincount((draws.double() * bins / bound).long().numpy(), minlength=bins)
        assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_release_is_the_rounded_sum_plus_integer_noise_on_the_grid(dtype):
    plan = plan_discrete_laplace(1.0, 1.0, 4, 2, grid=2.0 ** -2)  # t = ceil(4 (1 + 2^-2 * 2)) = 6
    assert plan.steps == 6
    clipped_sum = torch.tensor([0.3, -0.3, 0.1, 1.0] * 20_000, dtype=dtype).view(-1, 4)
    released = secure_noisy_sum(clipped_sum, plan, bits(11))
    assert released.shape == clipped_sum.shape and released.dtype == dtype
    steps = released.double() / plan.rounding.grid
    assert bool((steps == steps.round()).all())
    noise = (steps - torch.round(clipped_sum.double() / plan.rounding.grid)).view(-1).numpy()
    support = np.arange(-60, 60)
    assert_law(noise, support, stats.laplace(scale=6).cdf(support + 1) - stats.laplace(scale=6).cdf(support))


def test_gaussian_release_has_the_planned_variance():
    plan = plan_discrete_gaussian(2.0, 0.5, 10, grid=2.0 ** -3)
    released = secure_noisy_sum(torch.zeros(50_000, 10), plan, bits(12))
    steps = (released.double() / plan.rounding.grid).view(-1).numpy()
    assert np.all(steps == np.round(steps))
    assert np.var(steps) == pytest.approx(plan.variance, rel=0.02)
    assert plan.variance - 16 >= (2.0 * plan.rounding.inflated_clip / plan.rounding.grid) ** 2


def test_release_follows_its_key_and_the_system_source_differs():
    plan = plan_discrete_gaussian(1.0, 1.0, 100)
    zeros = torch.zeros(100)
    assert torch.equal(secure_noisy_sum(zeros, plan, bits(13)), secure_noisy_sum(zeros, plan, bits(13)))
    assert not torch.equal(secure_noisy_sum(zeros, plan, SystemRandomBits()),
                           secure_noisy_sum(zeros, plan, SystemRandomBits()))


def test_huge_sums_are_clamped_not_wrapped():
    plan = plan_discrete_laplace(1.0, 1.0, 3, 1)
    released = secure_noisy_sum(torch.tensor([1e300, -1e300, 0.0], dtype=torch.float64), plan, bits(14))
    limit = secure_noise.SUM_LIMIT * plan.rounding.grid
    assert released[0] > 0.99 * limit and released[1] < -0.99 * limit and abs(float(released[2])) < 100


def test_wrappers_plan_for_the_whole_model_and_refuse_shares():
    clipped_sum = torch.zeros(8)
    assert secure_laplace_sum(clipped_sum, 1.0, 1.0, bits(15), coordinates=1000).shape == (8,)
    assert secure_gaussian_sum(clipped_sum, 1.0, 1.0, bits(15), 1, coordinates=1000).shape == (8,)
    for call in (lambda: secure_laplace_sum(clipped_sum, 1.0, 1.0, bits(15), 2, coordinates=8),
                 lambda: secure_gaussian_sum(clipped_sum, 1.0, 1.0, bits(15), 3, coordinates=8)):
        with pytest.raises(InvalidParameterError, match="^shares must be 1"):
            call()


@pytest.mark.parametrize("bad_noise", [0.0, -1.0, math.inf, math.nan])
def test_non_positive_noise_is_refused_by_name(bad_noise):
    with pytest.raises(InvalidParameterError, match="^scale"):
        secure_laplace_sum(torch.zeros(3), bad_noise, 1.0, bits(16), coordinates=3)
    with pytest.raises(InvalidParameterError, match="^noise_multiplier"):
        secure_gaussian_sum(torch.zeros(3), bad_noise, 1.0, bits(16), coordinates=3)


def test_sums_that_cannot_be_served_are_refused():
    plan = plan_discrete_laplace(1.0, 1.0, 3, 2)
    with pytest.raises(InvalidParameterError, match="^clipped_sum must be a real floating-point"):
        secure_noisy_sum(torch.zeros(3, dtype=torch.int64), plan, bits(17))
    with pytest.raises(InvalidParameterError, match="^clipped_sum must be a real floating-point"):
        secure_noisy_sum(torch.zeros(3, dtype=torch.complex64), plan, bits(17))
    with pytest.raises(InvalidParameterError, match="meta device"):
        secure_noisy_sum(torch.zeros(3, device="meta"), plan, bits(17))
    with pytest.raises(SecureNoiseError, match="non-finite"):
        secure_noisy_sum(torch.tensor([0.0, math.nan, 1.0]), plan, bits(17))
    with pytest.raises(InvalidParameterError, match="^plan must be"):
        secure_noisy_sum(torch.zeros(3), "laplace", bits(17))


def test_short_keys_and_broken_sources_are_refused():
    with pytest.raises(InvalidParameterError, match="^key must be at least 32 bytes"):
        Shake256RandomBits(b"short")

    class Broken:
        def random_bytes(self, count):
            return torch.zeros(count // 2, dtype=torch.uint8)

    with pytest.raises(SecureNoiseError, match="random-bit source"):
        geometric(Broken(), 10, 5)


def test_the_sampler_uses_only_exact_integer_parameters():
    """t w (Gaussian) and t grid (Laplace) cover the noise asked for at the inflated clip, exactly."""
    laplace = plan_discrete_laplace(0.8, 1.0, 26_010, 2)
    exact_need = Fraction(0.8) * laplace.rounding.exact_inflated_clip / Fraction(1.0)
    assert Fraction(laplace.noise_scale) >= exact_need > Fraction(laplace.noise_scale) - Fraction(laplace.rounding.grid)


def test_several_parameters_are_released_in_one_call_with_independent_noise():
    plan = plan_discrete_laplace(1.0, 1.0, 20_006, 2, grid=2.0 ** -3)
    sums = [torch.zeros(2, 3), torch.full((10_000,), 0.5, dtype=torch.float64), torch.zeros(10_000)]
    released = secure_noise.secure_noisy_sums(sums, plan, bits(18))
    assert [r.shape for r in released] == [s.shape for s in sums]
    assert [r.dtype for r in released] == [s.dtype for s in sums]
    second, third = (released[1].double() - 0.5).numpy(), released[2].double().numpy()
    assert stats.ks_2samp(second, third).pvalue > 1e-3 and not np.array_equal(second, third)
    assert secure_noise.secure_noisy_sums([], plan, bits(18)) == []
