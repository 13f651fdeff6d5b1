"""Two-class Dirichlet PLD (docs/theory/dirichlet.md Sec. 1.3): domination, pessimism, agreement with the
exact lower bound, and its route dirichlet-pld of the default (events recording num_classes=2)."""

import json
import math

import numpy as np
import pytest
from scipy.special import betainc, betaln, expit

from dpnoise.accounting import InvalidParameterError, PldAccountant, epsilon_after, get_accountant
from dpnoise.accounting.events import DirichletEvent, PoissonSampledEvent, event_from_dict, event_to_dict
from dpnoise.accounting.pld.dirichlet import two_class_vertex_masses
from dpnoise.audit.pld import dirichlet_shift_laws, epsilon_lower_bound


def _hockey_stick(r: float, alpha: float, theta: float, theta_other: float, epsilon: np.ndarray) -> np.ndarray:
    """H_{e^eps}(P_theta || P_theta') for P_theta = Beta(alpha + r theta, alpha + r (1 - theta)), by integrating
    (p - e^eps p')_+ on a fine grid of logit(x) (an independent evaluation, no use of monotone likelihood ratios)."""
    t = np.linspace(-200, 200, 400_001)
    log_x, log_1mx, dt = -np.logaddexp(0, -t), -np.logaddexp(0, t), t[1] - t[0]

    def density(th: float) -> np.ndarray:  # density of T = logit(X)
        a, b = alpha + r * th, alpha + r * (1 - th)
        return np.exp(a * log_x + b * log_1mx - betaln(a, b))

    p, p_other = density(theta), density(theta_other)
    return np.array([np.sum(np.clip(p - np.exp(e) * p_other, 0, None)) * dt for e in epsilon])


@pytest.mark.parametrize("r,alpha", [(0.5, 1.0), (2.0, 0.3)])
def test_the_vertex_pair_dominates_every_two_class_pair(r, alpha):
    epsilon = np.array([-0.5, 0.0, 0.1, 0.4, 1.0])
    vertex = _hockey_stick(r, alpha, 1.0, 0.0, epsilon)
    for theta, theta_other in [(0.9, 0.1), (0.7, 0.2), (0.2, 0.6), (1.0, 0.5), (0.5, 0.0)]:
        assert np.all(_hockey_stick(r, alpha, theta, theta_other, epsilon) <= vertex + 1e-9)


def _exact_step_delta(q: float, r: float, alpha: float, epsilon: float) -> float:
    """delta(eps) of (1-q) bot + q P_1 vs (1-q) bot + q P_0: (1-q)(1-e^eps)_+ + q [P_1(L > eps) - e^eps P_0(L > eps)],
    L = r logit(X), with 40-digit incomplete Beta functions."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    eps = mpmath.mpf(epsilon)
    y = 1 / (1 + mpmath.exp(eps / r))  # 1 - expit(eps / r)
    above_1 = mpmath.betainc(alpha, alpha + r, 0, y, regularized=True)
    above_0 = mpmath.betainc(alpha + r, alpha, 0, y, regularized=True)
    return float((1 - q) * max(1 - mpmath.exp(eps), 0) + q * (above_1 - mpmath.exp(eps) * above_0))


def two_class_vertex_pld(q, r, alpha, grid):
    """The route's single-step PMF as a dp_accounting PLD (a test-only cross-check of its composition)."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    lowest, masses, infinity_mass = two_class_vertex_masses(q, r, alpha, grid)
    return privacy_loss_distribution.PrivacyLossDistribution(
        pld_pmf.DensePLDPmf(grid, lowest, masses, infinity_mass, pessimistic_estimate=True))


@pytest.mark.parametrize("q,r,alpha", [(0.01, 0.0804, 1.0), (1.0, 0.3, 0.5), (0.2, 1.5, 3.0)])
def test_single_step_pld_is_pessimistic_by_at_most_one_grid_step(q, r, alpha):
    grid = 1e-3
    pld = two_class_vertex_pld(q, r, alpha, grid)
    for epsilon in (0.0, 0.05, 0.3, 1.0, 3.0):
        got = pld.get_delta_for_epsilon(epsilon)
        # rounding every loss up by < one grid step: delta(eps) <= got <= delta(eps - grid)
        assert _exact_step_delta(q, r, alpha, epsilon) <= got <= _exact_step_delta(q, r, alpha, epsilon - grid) + 1e-13


def test_masses_cover_the_whole_distribution():
    lowest, masses, infinity_mass = two_class_vertex_masses(0.3, 0.2, 1.0, 1e-3)
    total = masses.sum() + infinity_mass
    assert 1.0 <= total <= 1.0 + 1e-10
    assert lowest < 0 and masses[-lowest] >= 0.7  # "not sampled": loss exactly 0
    assert np.all(masses >= 0) and 0 < infinity_mass < 1e-25
    # the mass at and above each grid loss is at least the exact tail P(L > (k - 1) h) of the sampled part
    h, losses = 1e-3, 1e-3 * (lowest + np.arange(masses.size))
    tail = np.cumsum(masses[::-1])[::-1] + infinity_mass
    for k in (masses.size - 1, masses.size - 500, -lowest + 300):
        exact = 0.3 * betainc(1.0, 1.2, expit(-(losses[k] - h) / 0.2))
        assert tail[k] >= exact


def test_composed_two_class_pld_lies_between_the_exact_lower_bound_and_the_rdp_bound():
    """T = 200 steps at q = 0.05: the audit's exact lower bound for the same pair <= PLD route <= RDP default."""
    q, r, alpha, steps, delta = 0.05, 0.1, 1.0, 200, 1e-5
    upper = two_class_vertex_pld(q, r, alpha, 1e-4).self_compose(steps).get_epsilon_for_delta(delta)
    lower = epsilon_lower_bound(dirichlet_shift_laws(r, alpha, grid=1 << 16), q, steps, delta,
                                directions=("replace-one",))["replace-one"]
    rdp = epsilon_after("dirichlet", steps=steps, delta=delta, sample_rate=q, concentration=r, alpha=alpha)
    assert lower <= upper <= lower + 0.02 * upper
    assert upper < rdp


# ------------------------------------------------------------- the route dirichlet-pld of the default
SETTINGS = [(0.05, 0.1, 1.0, 200), (0.5, 0.05, 0.2, 50), (1.0, 0.3, 0.5, 3)]


def _routes(q, r, alpha, steps, delta, num_classes=2):
    acc = get_accountant("dirichlet").step(concentration=r, alpha=alpha, sample_rate=q, steps=steps,
                                           num_classes=num_classes)
    return acc.get_epsilon_and_bound(delta), {name: value for name, (value, _) in acc.epsilon_by_route(delta).items()}


@pytest.mark.parametrize("q,r,alpha,steps", SETTINGS)
@pytest.mark.parametrize("delta", [1e-5, 1e-12])
def test_route_is_never_below_the_exact_lower_bound(q, r, alpha, steps, delta):
    lower = epsilon_lower_bound(dirichlet_shift_laws(r, alpha, grid=1 << 15), q, steps, delta,
                                directions=("replace-one",))["replace-one"]
    (epsilon, bound), by_route = _routes(q, r, alpha, steps, delta)
    assert lower <= by_route["dirichlet-pld"] and lower <= epsilon
    assert epsilon == min(by_route.values())
    # Far below the RDP routes, at 1e-12 too (the tilted composition's round-off bound is relative to delta);
    # above the exact value by the rounding of losses up to the 1e-3 grid, less than one grid step per
    # release (at most ~3 T q releases matter here).
    assert bound.startswith("dirichlet-pld: PLD") and epsilon <= lower + 1e-3 * (3 * steps * q + 3)
    assert by_route["dirichlet-pld"] < min(by_route["dirichlet-release-count"], by_route["dirichlet-rdp"])


def test_route_is_the_release_count_mixture_of_the_exact_vertex_profiles():
    """Composing the one-step PLD (loss 0 w.p. 1 - q, the pair's loss w.p. q) T times is the Bin(T, q) mixture over
    the number of releases of the k-fold vertex pair's exact profiles (docs/theory/dirichlet.md Sec. 1.3): at q = 1
    the same PLD composed k times gives delta_k, and the mixture of those matches the route at q < 1."""
    from scipy.stats import binom

    q, r, alpha, steps, epsilon = 0.3, 0.2, 1.0, 4, 0.3
    route = PldAccountant("dirichlet-pld").step(concentration=r, alpha=alpha, sample_rate=q, steps=steps,
                                                 num_classes=2)
    profiles = [0.0] + [PldAccountant("dirichlet-pld").step(concentration=r, alpha=alpha, sample_rate=1.0, steps=k,
                                                            num_classes=2).get_delta(epsilon) for k in range(1, steps + 1)]
    mixture = float(binom.pmf(np.arange(steps + 1), steps, q) @ np.array(profiles))
    assert route.get_delta(epsilon) == pytest.approx(mixture, rel=2e-6)  # the masses' error allowances differ
    # and one release at q = 1 is the base pair's exact delta (up to the grid)
    exact = _exact_step_delta(1.0, r, alpha, epsilon)
    assert exact <= profiles[1] <= _exact_step_delta(1.0, r, alpha, epsilon - 1e-3) + 1e-12


@pytest.mark.parametrize("num_classes", [None, 10])
def test_route_does_not_apply_without_two_classes(num_classes):
    (epsilon, bound), by_route = _routes(0.05, 0.1, 1.0, 200, 1e-5, num_classes)
    assert by_route["dirichlet-pld"] == math.inf
    # a route listed after the one that answered is not named in the bound (it does not apply here)
    assert "dirichlet-pld" not in bound
    reason = PldAccountant("dirichlet-pld").step(concentration=0.1, alpha=1.0, sample_rate=0.05, steps=200,
                                                 num_classes=num_classes).get_epsilon_and_bound(1e-5)[1]
    assert f"PLD not computed: no PLD for DirichletEvent with num_classes={num_classes}" in reason
    assert epsilon == min(by_route["dirichlet-release-count"], by_route["dirichlet-rdp"])
    alone = PldAccountant("dirichlet-pld").step(concentration=0.1, alpha=1.0, sample_rate=0.05, steps=200,
                                                num_classes=num_classes)  # accepted: answers +inf
    assert alone.get_epsilon(1e-5) == math.inf and alone.get_delta(1.0) == 1.0


@pytest.mark.parametrize("r,alpha", [(5e-5, 1.0), (6.0, 10.0), (0.001, 0.005)])
def test_route_does_not_apply_outside_the_checked_range(r, alpha):
    acc = PldAccountant("dirichlet-pld").step(concentration=r, alpha=alpha, sample_rate=0.05, steps=10, num_classes=2)
    epsilon, bound = acc.get_epsilon_and_bound(1e-5)
    assert epsilon == math.inf and "outside the range" in bound


def test_other_pld_accountants_still_refuse_dirichlet_events_without_two_classes():
    with pytest.raises(InvalidParameterError, match="gaussian-pld.*num_classes=None"):
        get_accountant("gaussian").compose(DirichletEvent(0.5, 1.0))


# ------------------------------------------------------------------------ DirichletEvent.num_classes
@pytest.mark.parametrize("value", [1, 0, -2, True, 2.0, "2", 2.5])
def test_num_classes_must_be_an_integer_of_at_least_two(value):
    with pytest.raises(InvalidParameterError, match="num_classes"):
        DirichletEvent(0.1, 1.0, value)


def test_num_classes_in_equality_hash_and_serialisation():
    two = DirichletEvent(0.1, 1.0, np.int64(2))
    assert two == DirichletEvent(0.1, 1.0, 2) and hash(two) == hash(DirichletEvent(0.1, 1.0, 2))
    assert type(two.num_classes) is int and two != DirichletEvent(0.1, 1.0)
    # unrecorded: written as before the field existed, and such descriptions still load
    assert event_to_dict(DirichletEvent(0.1, 1.0)) == {"type": "DirichletEvent", "r": 0.1, "alpha": 1.0}
    assert event_from_dict({"type": "DirichletEvent", "r": 0.1, "alpha": 1.0}) == DirichletEvent(0.1, 1.0)
    assert event_to_dict(two)["num_classes"] == 2 and event_from_dict(event_to_dict(two)) == two
    for bad in (1, None, "2", 2.0):
        data = {"type": "DirichletEvent", "r": 0.1, "alpha": 1.0, "num_classes": bad}
        if bad is None:  # None written out explicitly is the default
            assert event_from_dict(data) == DirichletEvent(0.1, 1.0)
            continue
        with pytest.raises(InvalidParameterError, match="num_classes"):
            event_from_dict(data)
    with pytest.raises(InvalidParameterError, match="optional: num_classes"):
        event_from_dict({"type": "DirichletEvent", "r": 0.1})


def test_state_dict_round_trip_keeps_the_route():
    acc = get_accountant("dirichlet").step(concentration=0.1, alpha=1.0, sample_rate=0.05, steps=200, num_classes=2)
    clone = get_accountant("dirichlet")
    clone.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert clone.history == acc.history and clone.get_epsilon_and_bound(1e-5) == acc.get_epsilon_and_bound(1e-5)
    assert clone.get_epsilon_and_bound(1e-5)[1].startswith("dirichlet-pld")


def test_num_classes_is_a_dirichlet_keyword_only():
    with pytest.raises(InvalidParameterError, match="num_classes"):
        get_accountant("gaussian").step(noise_multiplier=1.0, sample_rate=0.1, num_classes=2)
    acc = get_accountant("dirichlet").step(concentration=0.1, sample_rate=0.1, num_classes=2)
    acc.step(concentration=0.1, sample_rate=0.1, num_classes=2)
    assert acc.history == [(PoissonSampledEvent(0.1, DirichletEvent(0.1, 1.0, 2)), 2)]

