"""Output mechanisms accounted by the changed example's number of releases (docs/theory/dirichlet.md Sec. 2.4).

Replace-one adjacency, each sampled example's output released with it: over T Poisson-sampled
steps the changed example is released in K ~ Bin(T, q) of them, with the same law under both
datasets, and its other steps release nothing of it.  Conditioned on the steps that include it,
the view is k adaptively composed releases; the hockey-stick divergence of a mixture over a
component with the same law under both datasets (and seen, or not, by the adversary) is at most
the mixture of the components' divergences, so the privacy profile is

    delta(eps) = sum_k Bin(k; T, q) delta_k(eps),

with delta_k the profile of k composed releases:

* a Gaussian release (noise multiplier s at sensitivity 1, the penultimate-layer baseline's
  s = sigma / 2): k releases are (sqrt(k) / s)-GDP, whose profile is exact (Dong, Roth & Su,
  arXiv 1905.02383, Cor. 2.13 and Cor. 3.3), so the mixture is the exact profile;
* any release with an RDP curve eps(a) (the Dirichlet mechanism): k releases have RDP k eps(a)
  (Mironov 2017, arXiv 1702.07476, Prop. 1), converted for each k at its own best order
  (Balle et al. 2020, arXiv 1905.09982, Thm 21).  Since the mixture's RDP converts at one order
  for all k, this is never above the RDP route's delta.

Every computed delta is an upper bound: binomial weights and profiles are raised by bounds on
their rounding; counts above a Chernoff window are charged delta_k = 1, counts below it the
profile of the window's first count (delta_k is non-decreasing in k); a wide window is split
into groups of counts, each charged the profile of its largest count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp, xlog1py

from dpnoise.accounting.accountant import PrivacyAccountant, flat_ledger
from dpnoise.accounting.events import DpEvent, MechanismEvent, PoissonSampledEvent
from dpnoise.accounting.kinds import AccountantKind, register_accountant_kind
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.accounting.rdp.registry import RdpRoute, event_rdp
from dpnoise.accounting.solvers import find_root, solve_directly
from dpnoise.accounting.validation import InvalidParameterError, check_count, check_sample_rate

_ULP = float(np.finfo(float).eps)
#: Rounding allowance, in ulp of the magnitudes that enter a value (each is within a few ulp).
_ROUNDING_ULPS = 16.0
#: Counts above the window carry at most this fraction of the delta asked for.
TAIL_FRACTION = 1e-10
#: log of the largest mass left above the window when no delta is given (get_delta): 1e-300.
LOG_TAIL_WITHOUT_TARGET = -690.0
#: At most this many groups of counts are evaluated (wider windows are grouped).
MAX_GROUPS = 4096
#: Windows of more counts (Bin(T, q) with a standard deviation above about 1e5) are not attempted.
MAX_WINDOW = 1 << 22
#: Epsilons beyond this are reported as +inf.
MAX_EPSILON = 1e300
#: log delta_k below this (delta_k = 0 in double precision) is replaced by one term e^LOG_NEGLIGIBLE
#: in the mixture, which bounds the sum of all such terms (their weights sum to at most 1).
LOG_NEGLIGIBLE = -745.0


@dataclass(frozen=True)
class ReleaseCounts:
    """K ~ Bin(T, q) as the mixture uses it.

    ``counts``: the largest count of each group; ``log_mass``: upper bounds on log P(K in the group),
    the first group also holding the mass below the window; ``log_tail``: an upper bound on
    log P(K > counts[-1]).
    """

    counts: np.ndarray
    log_mass: np.ndarray
    log_tail: float


def _allowance(*terms: np.ndarray) -> np.ndarray:
    """A bound on the rounding error of a sum of the ``terms`` (each computed within a few ulp)."""
    with np.errstate(invalid="ignore"):
        return _ROUNDING_ULPS * _ULP * (sum(np.abs(t) for t in terms) + 1.0)


def _deviance(count: np.ndarray, mean: float) -> tuple[np.ndarray, np.ndarray]:
    """(x log(x / m) + m - x, a bound on its rounding): Loader's bd0 (2000, "Fast and accurate computation
    of binomial probabilities"), as x log1p((x - m) / m) - (x - m), no cancellation for x near m.

    The allowance covers the rounding of m itself (d/dm = (m - x) / m: ulp m |m - x| / m).
    """
    x = np.asarray(count, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        relative = (x - mean) / mean
        log_term = np.where(np.isfinite(relative), xlog1py(x, relative), x * (np.log(x) - np.log(mean)))
        log_term = np.where(x > 0, log_term, 0.0)
    return log_term - (x - mean), _allowance(log_term, x - mean)


def _binomial_deviance(steps: int, q: float, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T KL(k/T || q) = bd0(k, Tq) + bd0(T - k, T (1 - q)), a bound on its rounding)."""
    k = np.asarray(count, dtype=float)
    inside, inside_error = _deviance(k, steps * q)
    outside, outside_error = _deviance(steps - k, steps * (1.0 - q))
    return inside + outside, inside_error + outside_error


def log_binomial_tail_bound(steps: int, q: float, count: np.ndarray) -> np.ndarray:
    """Upper bound on log P(K >= k) for k >= Tq, and on log P(K <= k) for k <= Tq, K ~ Bin(T, q):
    -T KL(k/T || q) (Chernoff-Hoeffding; Hoeffding 1963, Thm 1), raised by its rounding."""
    deviance, error = _binomial_deviance(steps, q, count)
    return np.minimum(-deviance + error, 0.0)


#: Stirling's series of log n! - [(n + 1/2) log n - n + log sqrt(2 pi)], terms n^-1 .. n^-9.
_STIRLING_COEFFICIENTS = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188)
#: From n = 16 on, the series' truncation error (below its next term, 691 / (360360 n^11)) is < 2e-16.
_STIRLING_SERIES_FROM = 16
_STIRLING_TRUNCATION = 2e-16
_LOG_SQRT_TWO_PI = 0.5 * math.log(2 * math.pi)


def _stirling_error(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log n! - [(n + 1/2) log n - n + log sqrt(2 pi)], a bound on its error) for integers n >= 1:
    log-Gamma directly below 16 (magnitudes below 50), Stirling's series from 16 (alternating, so its
    error is below the first omitted term)."""
    n = np.asarray(n, dtype=float)
    small = np.minimum(n, _STIRLING_SERIES_FROM)
    direct_terms = (gammaln(small + 1), -(small + 0.5) * np.log(small), small, -_LOG_SQRT_TWO_PI)
    inverse_square = 1.0 / (n * n)
    series = np.zeros_like(n)
    for coefficient in reversed(_STIRLING_COEFFICIENTS):
        series = coefficient + inverse_square * series
    series = series / n
    value = np.where(n < _STIRLING_SERIES_FROM, sum(direct_terms), series)
    error = np.where(n < _STIRLING_SERIES_FROM, _allowance(*direct_terms), _STIRLING_TRUNCATION + _allowance(series))
    return value, error


def log_binomial_pmf_bound(steps: int, q: float, count: np.ndarray) -> np.ndarray:
    """Upper bound on log Bin(k; T, q), in Loader's saddle-point form (no cancellation at large T):

    log Bin(k; T, q) = log sqrt(T / (2 pi k (T - k))) + s(T) - s(k) - s(T - k) - T KL(k/T || q),

    s the Stirling error of :func:`_stirling_error`; for k = 0 or T, -T KL(k/T || q) alone.
    """
    k = np.asarray(count, dtype=float)
    deviance, error = _binomial_deviance(steps, q, k)
    interior = (k > 0) & (k < steps)
    inner = np.where(interior, k, 1.0)
    with np.errstate(divide="ignore"):
        root_terms = (0.5 * math.log(steps), -0.5 * np.log(inner), -0.5 * np.log(np.where(interior, steps - k, 1.0)),
                      -_LOG_SQRT_TWO_PI * np.ones_like(k))
    (s_total, e_total), (s_k, e_k), (s_rest, e_rest) = (
        _stirling_error(np.full_like(k, float(steps))), _stirling_error(inner),
        _stirling_error(np.where(interior, steps - k, 1.0)))
    correction = np.where(interior, sum(root_terms) + s_total - s_k - s_rest, 0.0)
    correction_error = np.where(interior, _allowance(*root_terms, s_total, s_k, s_rest) + e_total + e_k + e_rest, 0.0)
    return -deviance + correction + error + correction_error


def _smallest(lo: int, hi: int, holds: Callable[[int], bool]) -> int:
    """The smallest n in [lo, hi] with ``holds(n)``, for ``holds`` False then True, and True at hi (bisection)."""
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo


def _window(steps: int, q: float, log_tail: float) -> tuple[int, int]:
    """The counts [first, last] with P(K > last) <= e^log_tail and P(K < first) <= e^log_tail, K ~ Bin(T, q)
    (the Chernoff bounds of :func:`log_binomial_tail_bound`, monotone on each side of Tq)."""
    def below_tail(count: int) -> bool:
        return float(log_binomial_tail_bound(steps, q, np.array([float(count)]))[0]) <= log_tail

    mean = steps * q
    last = _smallest(min(steps, math.ceil(mean)), steps, lambda n: n == steps or below_tail(n + 1))
    bottom = max(0, math.floor(mean))
    first = bottom - _smallest(0, bottom, lambda j: j == bottom or below_tail(bottom - j - 1))
    return first, last


@lru_cache(maxsize=256)
def release_counts(steps: int, q: float, log_tail: float) -> ReleaseCounts | str:
    """The grouped law of K ~ Bin(``steps``, ``q``) with log P(K above the window) <= ``log_tail``,
    or the reason it is not computed (a window of more than :data:`MAX_WINDOW` counts)."""
    steps = check_count("steps", steps, 1)
    q = check_sample_rate("sample_rate", q)
    if q == 1.0:
        return ReleaseCounts(np.array([float(steps)]), np.zeros(1), -math.inf)
    first, last = _window(steps, q, log_tail)
    if last - first + 1 > MAX_WINDOW:
        return f"Bin({steps}, {q:g}) needs {last - first + 1} release counts (more than {MAX_WINDOW})"
    k = np.arange(first, last + 1, dtype=float)
    log_w = log_binomial_pmf_bound(steps, q, k)
    if first > 0:  # counts below the window: charged the first count's profile
        log_w[0] = np.logaddexp(log_w[0], log_binomial_tail_bound(steps, q, np.array([first - 1.0]))[0])
    width = -(-k.size // MAX_GROUPS)
    starts = np.arange(0, k.size, width)
    log_mass = np.logaddexp.reduceat(log_w, starts) + 4 * width * _ULP
    counts = k[np.minimum(starts + width, k.size) - 1]
    tail = float(log_binomial_tail_bound(steps, q, np.array([last + 1.0]))[0]) if last < steps else -math.inf
    counts.setflags(write=False)
    log_mass.setflags(write=False)
    return ReleaseCounts(counts, log_mass, tail)


def gaussian_log_profile(epsilon: float, mu: np.ndarray) -> np.ndarray:
    """Upper bound on log delta(eps) of mu-GDP: delta = Phi(-x) - e^eps Phi(-x - mu), x = eps/mu - mu/2.

    Dong, Roth & Su (arXiv 1905.02383), Cor. 2.13; Balle & Wang (2018, arXiv 1805.06530), Thm 8.
    Evaluated as log Phi(-x) + log(1 - e^-g), g = log Phi(-x) - log Phi(-x - mu) - eps >= 0 (no
    cancellation in log space), both raised by a bound on their rounding, including that of x;
    -inf where log Phi(-x) < :data:`LOG_NEGLIGIBLE` (delta <= Phi(-x)), and 0 (delta <= 1) where it
    cannot be evaluated (e.g. mu = inf).
    """
    mu = np.asarray(mu, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = epsilon / mu - mu / 2.0
        head, other = log_ndtr(-x), log_ndtr(-x - mu)
        gap = head - other - epsilon
        allowance = _allowance(head, other, epsilon, (np.abs(x) + mu) ** 2)
        gap_up = np.maximum(gap + allowance, 0.0)
        value = np.where(head < LOG_NEGLIGIBLE, -np.inf, head + allowance + np.log(-np.expm1(-gap_up)))
    return np.where(np.isnan(value), 0.0, np.minimum(value, 0.0))


def rdp_log_profile(epsilon: float, counts: np.ndarray, orders: np.ndarray, rdp: np.ndarray) -> np.ndarray:
    """Upper bound on log delta(eps) of k releases with RDP k eps(a), per count k, at its best order:
    min_a (a-1) (k eps(a) - eps + log(1 - 1/a)) - log a (Balle et al. 2020, arXiv 1905.09982, Thm 21)."""
    finite = np.isfinite(rdp)
    if not finite.any():
        return np.zeros(np.shape(counts))
    a, curve = orders[finite][None, :], rdp[finite][None, :]
    k = np.asarray(counts, dtype=float)[:, None]
    terms = ((a - 1) * k * curve, -(a - 1) * epsilon, (a - 1) * np.log1p(-1.0 / a), -np.log(a))
    value = np.min(sum(terms) + _allowance(*terms), axis=1)
    return np.minimum(value, 0.0)


LogProfile = Callable[[float, np.ndarray], np.ndarray]
#: event -> (eps, counts) -> upper bounds on log delta_k(eps) of k releases of the event
ExactLogProfile = Callable[[MechanismEvent], LogProfile]
#: event type -> its k-release profile in closed form, for the event types that have one (registered by
#: their mechanism's plugin, :class:`~dpnoise.accounting.plugin.MechanismPlugin`)
EXACT_LOG_PROFILES: dict[type, ExactLogProfile] = {}


def register_exact_log_profile(event_type: type, profile: ExactLogProfile) -> None:
    """Let releases of ``event_type`` be accounted by ``profile`` instead of their RDP curve."""
    if event_type in EXACT_LOG_PROFILES:
        raise InvalidParameterError(f"{event_type.__name__} already has an exact release profile")
    EXACT_LOG_PROFILES[event_type] = profile
    _forget_cached_values()


def unregister_exact_log_profile(event_type: type) -> None:
    """Undo :func:`register_exact_log_profile`."""
    EXACT_LOG_PROFILES.pop(event_type, None)
    _forget_cached_values()


def _forget_cached_values() -> None:
    """Drop the cached epsilons and deltas, which may have been computed with another profile."""
    release_count_epsilon.cache_clear()
    release_count_delta.cache_clear()


def base_log_profile(event: MechanismEvent, route: RdpRoute, orders: np.ndarray) -> LogProfile:
    """(eps, counts) -> upper bounds on log delta_k(eps) of k releases of ``event``: its registered exact
    profile (:data:`EXACT_LOG_PROFILES`, e.g. a Gaussian release's), else from its RDP curve at ``orders``
    (by the RDP ``route``, None: the default)."""
    exact = EXACT_LOG_PROFILES.get(type(event))
    if exact is not None:
        return exact(event)
    rdp = np.asarray(event_rdp(event, orders, route), dtype=float)
    return lambda epsilon, counts: rdp_log_profile(epsilon, counts, orders, rdp)


def mixture_log_delta(counts: ReleaseCounts, log_profile: LogProfile, epsilon: float) -> float:
    """Upper bound on log sum_k Bin(k; T, q) delta_k(eps), delta_0 = 0 (no release), the tail above the
    window charged delta = 1, negligible profiles e^LOG_NEGLIGIBLE in all."""
    released = counts.counts > 0
    log_profiles = log_profile(epsilon, counts.counts[released])
    terms = np.where(log_profiles < LOG_NEGLIGIBLE, -np.inf, counts.log_mass[released] + log_profiles)
    log_delta = float(logsumexp(np.append(terms, [counts.log_tail, LOG_NEGLIGIBLE])))
    return min(log_delta + 4 * (terms.size + 2) * _ULP, 0.0)  # the sum's rounding


def smallest_epsilon(log_delta_of: Callable[[float], float], delta: float) -> float:
    """An epsilon with ``log_delta_of(epsilon) <= log delta``, as small as the search finds (+inf if
    none up to :data:`MAX_EPSILON`): :func:`~dpnoise.accounting.solvers.find_root` on the log profile, the
    answer checked and raised until it satisfies the inequality, so it is never below the computed profile's
    root."""
    target = math.log(delta)
    if log_delta_of(0.0) <= target:
        return 0.0
    if log_delta_of(MAX_EPSILON) > target:
        return math.inf
    lo, hi = 0.0, 1.0
    while log_delta_of(hi) > target:
        lo, hi = hi, min(hi * 4.0, MAX_EPSILON)
    epsilon = find_root(lambda e: log_delta_of(e) - target, lo, hi, xtol=1e-14, rtol=1e-13)
    step = max(abs(epsilon) * 1e-13, 1e-15)
    while log_delta_of(epsilon) > target:  # the root may sit a hair on the wrong side
        epsilon = min(epsilon + step, hi)
        step *= 4.0
    return float(epsilon)


def _mixture(event: PoissonSampledEvent, steps: int, log_tail: float, route: RdpRoute,
             orders: tuple[float, ...]) -> tuple[Optional[Callable[[float], float]], str]:
    """(eps -> an upper bound on log delta(eps), the bound's name), or (None, why it is not computed)."""
    counts = release_counts(steps, event.sampling_probability, log_tail)
    if isinstance(counts, str):
        return None, f"not computed: {counts}"
    profile = base_log_profile(event.event, route, np.asarray(orders))
    kind = ("exact profile of the releases" if type(event.event) in EXACT_LOG_PROFILES
            else "Renyi conversion per count")
    return (lambda epsilon: mixture_log_delta(counts, profile, epsilon),
            f"{kind}, Bin({steps}, {event.sampling_probability:g}) mixture over releases")


@lru_cache(maxsize=1024)
def release_count_epsilon(event: PoissonSampledEvent, steps: int, delta: float, route: RdpRoute,
                          orders: tuple[float, ...] = tuple(DEFAULT_ORDERS)) -> tuple[float, str]:
    """(epsilon(delta), the bound) of ``steps`` releases of ``event`` by release count, or (+inf, reason);
    the counts above the window carry at most :data:`TAIL_FRACTION` of ``delta``."""
    log_tail = max(math.log(delta) + math.log(TAIL_FRACTION), LOG_TAIL_WITHOUT_TARGET)
    log_delta_of, bound = _mixture(event, steps, log_tail, route, orders)
    return (math.inf, bound) if log_delta_of is None else (smallest_epsilon(log_delta_of, delta), bound)


@lru_cache(maxsize=1024)
def release_count_delta(event: PoissonSampledEvent, steps: int, epsilon: float, route: RdpRoute,
                        orders: tuple[float, ...] = tuple(DEFAULT_ORDERS)) -> float:
    """delta(epsilon) of ``steps`` releases of ``event`` by release count (1.0 where not computed)."""
    log_delta_of, _ = _mixture(event, steps, LOG_TAIL_WITHOUT_TARGET, route, orders)
    return 1.0 if log_delta_of is None else math.exp(log_delta_of(epsilon))


class ReleaseCountAccountant(PrivacyAccountant):
    """An output mechanism's profile as the Bin(T, q) mixture over the changed example's releases.

    Replace-one adjacency, each sampled example's output released with it (see the module
    docstring).  Applies to a ledger of one repeated Poisson-sampled release; any other ledger gets
    epsilon = +inf with the reason, and a minimum of routes then takes its other routes.

    >>> acc = ReleaseCountAccountant("penultimate-gaussian-exact")
    >>> round(acc.step(noise_multiplier=2.0, sample_rate=0.00512, steps=5860).get_epsilon(1e-5), 1)
    44.3
    """

    def _check_supported(self, event: DpEvent) -> None:
        for sampled, _ in flat_ledger([(event, 1)]):
            if type(sampled.event) not in EXACT_LOG_PROFILES:
                event_rdp(sampled.event, DEFAULT_ORDERS[:1], self.spec.rdp_route_key)

    def repeated_release(self) -> tuple[Optional[PoissonSampledEvent], int, Optional[str]]:
        """(the one repeated release, its count, None), or (None, 0, why the route does not apply)."""
        ledger = flat_ledger(self._accounted())
        events = {event for event, _ in ledger}
        if len(events) != 1:
            return None, 0, (f"the ledger holds {len(events)} different events; this route accounts one "
                             "repeated release")
        return ledger[0][0], sum(count for _, count in ledger), None

    def _epsilon_and_bound(self, delta: float) -> tuple[float, str]:
        event, steps, reason = self.repeated_release()
        if event is None:
            return math.inf, f"not computed: {reason}"
        return release_count_epsilon(event, steps, delta, self.spec.rdp_route_key)

    def _delta(self, epsilon: float) -> float:
        event, steps, _ = self.repeated_release()
        if event is None:
            return 1.0
        return release_count_delta(event, steps, epsilon, self.spec.rdp_route_key)


register_accountant_kind(AccountantKind("release-count", ReleaseCountAccountant, solve_directly, takes_rdp_route=True))

__all__ = [
    "ReleaseCountAccountant",
    "ReleaseCounts",
    "EXACT_LOG_PROFILES",
    "base_log_profile",
    "gaussian_log_profile",
    "log_binomial_pmf_bound",
    "log_binomial_tail_bound",
    "mixture_log_delta",
    "rdp_log_profile",
    "register_exact_log_profile",
    "release_count_delta",
    "release_count_epsilon",
    "release_counts",
    "smallest_epsilon",
    "unregister_exact_log_profile",
]
