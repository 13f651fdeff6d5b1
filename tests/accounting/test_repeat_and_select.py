"""Private hyperparameter tuning's accounting: the best of a random number K of trials released
(Papernot & Steinke, arXiv 2110.03620) as RepeatAndSelectEvent, against dp_accounting, against exact
Renyi divergences of a small discrete case, and never below one trial."""

import json
import math

import numpy as np
import pytest

from dpnoise.accounting import InvalidParameterError, get_accountant
from dpnoise.accounting.events import (
    DirichletEvent,
    GaussianEvent,
    PoissonSampledEvent,
    RepeatAndSelectEvent,
    SelfComposedEvent,
    event_from_dict,
    event_to_dict,
    to_dp_accounting,
)
from dpnoise.accounting.rdp.conversion import epsilon_from_rdp
from dpnoise.accounting.rdp.registry import event_rdp
from dpnoise.accounting.rdp.repeat_and_select import (
    repeat_and_select_rdp,
    truncated_negative_binomial_gamma,
    truncated_negative_binomial_mean,
)

SHAPES = (0.0, 0.5, 1.0, 3.0, math.inf)
RUN = SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent(1.0)), 1000)


INTEGER_ORDERS = np.arange(2.0, 129.0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("run", [RUN, SelfComposedEvent(PoissonSampledEvent(0.2, GaussianEvent(3.0)), 50)])
def test_the_rdp_route_agrees_with_dp_accounting(shape, run):
    """At integer orders, where both libraries' sampled Gaussian RDP is exact (at fractional ones
    dp_accounting's is a looser bound, up to 3x at order 1.1): the same curve for the truncated negative
    binomial; for Poisson each converts the trial's curve to (eps^, delta^) its own way, so the epsilons agree
    to 0.5%."""
    dp_accounting = pytest.importorskip("dp_accounting")
    tuned = RepeatAndSelectEvent(run, 10, shape)
    ours = event_rdp(tuned, INTEGER_ORDERS)
    theirs = dp_accounting.rdp.RdpAccountant(orders=list(INTEGER_ORDERS))
    theirs.compose(to_dp_accounting(tuned))
    if math.isinf(shape):
        for delta in (1e-5, 1e-8):
            assert epsilon_from_rdp(INTEGER_ORDERS, ours, delta)[0] == pytest.approx(theirs.get_epsilon(delta), rel=5e-3)
    else:
        np.testing.assert_allclose(ours, np.array(theirs._rdp), rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mean", [1.0, 1.5, 4.0, 30.0])
def test_tuning_never_costs_less_than_one_trial_and_more_trials_cost_more(shape, mean):
    single = get_accountant("gaussian").compose(RUN)
    tuned = get_accountant("gaussian").compose(RepeatAndSelectEvent(RUN, mean, shape))
    more = get_accountant("gaussian").compose(RepeatAndSelectEvent(RUN, 2 * mean, shape))
    for delta in (1e-5, 1e-9):
        assert single.get_epsilon(delta) <= tuned.get_epsilon(delta) <= more.get_epsilon(delta)
    if mean == 1 and not math.isinf(shape):  # one trial, exactly (a Poisson law of mean 1 may give 0 or 3 trials)
        assert get_accountant("gaussian-rdp").compose(RepeatAndSelectEvent(RUN, 1, shape)).get_epsilon(1e-5) == \
            get_accountant("gaussian-rdp").compose(RUN).get_epsilon(1e-5)


def bernoulli_renyi(p: float, q: float, order: float) -> float:
    """D_order(Bernoulli(p) || Bernoulli(q)), exactly."""
    return math.log(p ** order * q ** (1 - order) + (1 - p) ** order * (1 - q) ** (1 - order)) / (order - 1)


def renyi(first: np.ndarray, second: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(first ** order * second ** (1 - order))) / (order - 1))


def trial_count_law(mean: float, shape: float, largest: int = 20_000) -> np.ndarray:
    """P(K = k) for k = 0..largest (Poisson, or the truncated negative binomial of arXiv 2110.03620 Sec. 2)."""
    k = np.arange(largest + 1, dtype=float)
    if math.isinf(shape):
        from scipy.stats import poisson

        return poisson.pmf(k, mean)
    gamma = truncated_negative_binomial_gamma(shape, mean)
    with np.errstate(divide="ignore"):
        if shape == 0:
            log_weights = k * math.log1p(-gamma) - np.log(k)
        else:
            from scipy.special import gammaln

            log_weights = gammaln(k + shape) - gammaln(k + 1) - gammaln(shape) + k * math.log1p(-gamma)
    weights = np.where(k >= 1, np.exp(log_weights), 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize("shape,mean", [(shape, mean) for shape in SHAPES for mean in (2.0, 10.0)] + [(math.inf, 1.0)])
def test_the_bound_holds_for_the_best_of_k_randomized_responses_exactly(shape, mean):
    """One trial: randomized response on one bit, Bernoulli(p) vs Bernoulli(1 - p); its score is its output
    and the best trial is released (nothing where K = 0): the released law is exact, and its Renyi divergence
    at every order must be within the route's bound computed from the trial's exact curve."""
    p = math.exp(1.0) / (1 + math.exp(1.0))
    orders = np.concatenate([np.linspace(1.1, 10, 60), [12, 16, 24, 32, 64]])
    trial = np.array([max(bernoulli_renyi(p, 1 - p, a), bernoulli_renyi(1 - p, p, a)) for a in orders])
    bound = repeat_and_select_rdp(orders, trial, mean, shape)
    law = trial_count_law(mean, shape)
    k = np.arange(len(law))

    def released(success: float) -> np.ndarray:  # P(nothing), P(best is 0), P(best is 1)
        none = law[0]
        all_zero = float(np.sum(law * (1 - success) ** k)) - none
        return np.array([none, all_zero, 1 - none - all_zero])

    first, second = released(p), released(1 - p)
    for order, limit in zip(orders, bound):
        exact = max(renyi(first[first > 0], second[first > 0], order), renyi(second[second > 0], first[second > 0], order))
        assert exact <= limit + 1e-12, (order, exact, limit)
    assert np.all(bound >= trial - 1e-12)


@pytest.mark.parametrize("shape", [0.0, 0.3, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("mean", [1.01, 2.0, 10.0, 1000.0])
def test_gamma_is_found_for_the_mean(shape, mean):
    gamma = truncated_negative_binomial_gamma(shape, mean)
    assert 0 < gamma < 1 and truncated_negative_binomial_mean(shape, gamma) == pytest.approx(mean, rel=1e-9)


def test_the_event_checks_its_fields_round_trips_and_the_pld_route_says_why_it_does_not_answer():
    for mean, shape in ((0.5, 1.0), (math.nan, 1.0), (math.inf, 1.0), (2.0, -1.0), (2.0, math.nan), (True, 1.0)):
        with pytest.raises(InvalidParameterError):
            RepeatAndSelectEvent(RUN, mean, shape)
    event = RepeatAndSelectEvent(RUN, 5, math.inf)
    assert event_from_dict(json.loads(json.dumps(event_to_dict(event)))) == event
    epsilon, bound = get_accountant("gaussian").compose(event).get_epsilon_and_bound(1e-5)
    assert bound.startswith("gaussian-rdp") and "no PLD for RepeatAndSelectEvent" in bound and math.isfinite(epsilon)
    alone = get_accountant("gaussian-pld").compose(event).get_epsilon_and_bound(1e-5)
    assert alone[0] == math.inf and "no PLD for RepeatAndSelectEvent" in alone[1]
    with pytest.raises(InvalidParameterError, match="no PLD for DirichletEvent"):  # a trial it cannot account
        get_accountant("gaussian").compose(RepeatAndSelectEvent(PoissonSampledEvent(0.1, DirichletEvent(0.5, 1.0)), 3, 1.0))
