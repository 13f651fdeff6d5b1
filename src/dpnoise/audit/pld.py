"""Exact LOWER bounds on epsilon(delta) from privacy loss distributions (PLDs).

For one fixed neighbouring pair, the Poisson-subsampled mechanism composed over T steps has a tight
privacy profile delta(eps) = E_P[(1 - e^{eps - L})_+] (hockey-stick divergence, Balle et al. 2018),
with L = log(dP/dQ) under P and the T-step loss the sum of T i.i.d. per-step losses.  Any accountant
that reports an epsilon below the one computed here for a feasible pair is therefore unsound.

Every discretisation step below only LOWERS delta(eps), so the result is a rigorous lower bound (up
to floating-point round-off of the FFTs, ~1e-13 in delta):

* privacy losses are rounded DOWN (the integrand is increasing in L; for composed sums a per-step
  coupling L_hat <= L suffices);
* mass in truncated tails is dropped (the integrand is >= 0);
* mass that the cyclic FFT convolution could wrap into the window is bounded by Hoeffding (shift laws)
  or Chernoff (composition) tail bounds and carried as ``slack``; a measure enlarged by at most
  ``eta`` per step moves delta by at most (1 + eta)^T - 1, which is subtracted at the end.

Pairs (the ``audit_pair`` of each mechanism in :data:`dpnoise.accounting.MECHANISMS`, read off the
mechanism's per-step event, whose noise is relative to the sensitivity):

* ``gaussian-shift``: the 1-D shift C with noise N(0, sigma^2 C^2): Y = log(dP_v/dP_0) ~ N(-+mu^2/2, mu^2),
  mu = 1/sigma.
* ``laplace-shift``: the 1-D shift C with Lap(b) noise (L1 clipping).
* ``laplace-spread``: the L2-feasible shift v = (C/sqrt(k))(1,..,1,0,..) with i.i.d. Lap(b) noise; Y is the sum
  of k i.i.d. clipped-linear terms (|z| - |z - u|)/b, obtained by FFT convolution (docs/theory/lap2.md §3).
* ``dirichlet-vertex``: the vertex pair Dir(r e_1 + alpha) vs Dir(r e_2 + alpha) (docs/theory/dirichlet.md §1.2, the
  limit of feasible softmax outputs); Y = r log(G_1/G_2) = r logit(Beta), independent of d.

Subsampling (one Bernoulli draw per example and step): add direction P = (1-q) P_0 + q P_v, Q = P_0,
L = log(1 - q + q e^Y); remove direction P = P_0, Q = the mixture, L = -log(1 - q + q e^Y).  Output
mechanisms (each sampled example's own noisy output released, replace-one adjacency): the changed
example is released in the same steps under both datasets, so L = 0 with probability 1 - q and
L = Y with probability q ("replace-one"; the pairs are symmetric, so one direction suffices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import scipy.fft
import scipy.special
from scipy.stats import norm

from dpnoise.accounting import MechanismOptions, RunFacts, get_mechanism_spec
from dpnoise.accounting.validation import InvalidParameterError

__all__ = [
    "ShiftLaws",
    "LossDistribution",
    "BoundResult",
    "gaussian_shift_laws",
    "laplace_shift_laws",
    "dirichlet_shift_laws",
    "subsampled_loss_distribution",
    "compose",
    "epsilon_for_delta",
    "epsilon_lower_bound",
    "lower_bound",
    "lower_bound_of_event",
    "default_k_grid",
    "shift_laws",
    "PAIR_FAMILIES",
    "PairFamily",
    "register_pair_family",
]


#: tail mass allowed (per tail) when truncating or wrapping distributions
TAIL_MASS = 1e-30


@dataclass(frozen=True)
class ShiftLaws:
    """Law of Y = log(dP_v/dP_0) on the symmetric grid y_j = j * step, j = -J..J.

    ``p0`` is the law of a variable Y_hat <= Y under P_0 (Y rounded DOWN), ``pv`` the same under P_v
    (both possibly sub-probability: dropped tails).  The pair is mirror-symmetric (Y under P_v has the
    law of -Y under P_0, true for all mechanisms here), so ``pv[::-1]`` is the law of a variable
    >= Y under P_0 (Y rounded UP), used for the remove direction.  ``slack`` bounds the total mass
    that may have been ADDED to either law (cyclic wrap-around of the FFT).
    """

    step: float
    p0: np.ndarray
    pv: np.ndarray
    slack: float = 0.0

    @property
    def y(self) -> np.ndarray:
        """Grid values y_j = j * step."""
        half = (len(self.p0) - 1) // 2
        return self.step * np.arange(-half, half + 1)


@dataclass(frozen=True)
class LossDistribution:
    """Per-step or composed privacy-loss law on the grid l_i = step * (offset + i).

    ``mass`` is a sub-probability vector of a loss that is <= the true one (coupling); ``slack``
    bounds mass that may have been added (see module docstring).
    """

    step: float
    offset: int
    mass: np.ndarray
    slack: float = 0.0

    @property
    def values(self) -> np.ndarray:
        """Loss values l_i."""
        return self.step * (self.offset + np.arange(len(self.mass)))


def _interval_masses(edges: np.ndarray, cdf: Callable, sf: Callable) -> np.ndarray:
    """P(a <= X < b) for consecutive ``edges``, via the cdf left of 0 and the sf right of 0.

    Using the survival function on the right keeps the tiny upper-tail masses accurate.
    """
    lo, hi = edges[:-1], edges[1:]
    left = cdf(np.minimum(hi, 0.0)) - cdf(np.minimum(lo, 0.0))
    right = sf(np.maximum(lo, 0.0)) - sf(np.maximum(hi, 0.0))
    return np.clip(left, 0.0, None) + np.clip(right, 0.0, None)


def _continuous_shift_laws(
    half_width: float, grid: int, cdf0: Callable, sf0: Callable
) -> ShiftLaws:
    """Discretise a mirror-symmetric continuous pair given Y's cdf/sf under P_0 (floor rounding).

    ``grid`` cells of width 2 half_width/grid; cell [y_j, y_j + step) goes to y_j; mass outside
    [-half_width, half_width] is dropped.
    """
    half = grid // 2
    step = half_width / half
    edges = step * np.arange(-half, half + 2)
    p0 = _interval_masses(edges, cdf0, sf0)
    # Y under P_v has the law of -Y under P_0: P_v(Y < x) = P_0(Y > -x).
    pv = _interval_masses(edges, lambda x: sf0(-x), lambda x: cdf0(-x))
    return ShiftLaws(step, p0, pv)


def gaussian_shift_laws(sigma: float, grid: int = 1 << 20) -> ShiftLaws:
    """Y for the Gaussian mechanism with noise multiplier ``sigma``: N(-mu^2/2, mu^2), mu = 1/sigma."""
    mu = 1.0 / sigma
    z = np.sqrt(2.0 * np.log(1.0 / TAIL_MASS))
    dist = norm(loc=-mu * mu / 2.0, scale=mu)
    return _continuous_shift_laws(mu * mu / 2.0 + z * mu, grid, dist.cdf, dist.sf)


def dirichlet_shift_laws(r: float, alpha: float, grid: int = 1 << 20) -> ShiftLaws:
    """Y for the Dirichlet vertex pair: Y = r logit(x), x ~ Beta(alpha, alpha + r) under P_0.

    log(dDir(r e_1 + alpha)/dDir(r e_2 + alpha)) = r (log p_1 - log p_2) (the normalisers cancel),
    and log(p_1/p_2) = log(G_1/G_2) with independent Gammas, so the pair does not depend on d.
    """
    a, b = alpha, alpha + r

    def cdf0(y: np.ndarray) -> np.ndarray:
        return scipy.special.betainc(a, b, scipy.special.expit(y / r))

    def sf0(y: np.ndarray) -> np.ndarray:
        return scipy.special.betainc(b, a, scipy.special.expit(-y / r))

    # expand the window until both tails are below TAIL_MASS
    half_width = r * 10.0
    while cdf0(np.array(-half_width)) > TAIL_MASS or sf0(np.array(half_width)) > TAIL_MASS:
        half_width *= 1.5
    return _continuous_shift_laws(half_width, grid, cdf0, sf0)


def _laplace_coordinate_masses(t: float, m: int, under_shift: bool) -> np.ndarray:
    """Floor-discretised law of one coordinate's term on the grid (t/m) j, j = -m..m.

    Under P_0 (z ~ Lap(0, b)) the term l = (|z| - |z - u|)/b, t = u/b, is -t w.p. 1/2, +t w.p.
    e^{-t}/2, and in between P(l < s) = 1 - e^{-(s+t)/2}/2, so cell [s, s+h) holds
    e^{-(s+t)/2}(1 - e^{-h/2})/2.  Under P_v (z ~ Lap(u, b)) the term has the law of -l: the atoms
    swap and the interior cell [s, s+h) holds the P_0 mass of (-s-h, -s].
    """
    h = t / m
    s = h * np.arange(-m, m)  # left edges of the interior cells
    if under_shift:
        s = -s - h
    masses = np.empty(2 * m + 1)
    masses[:-1] = 0.5 * np.exp(-(s + t) / 2.0) * -np.expm1(-h / 2.0)
    low_atom, high_atom = (np.exp(-t) / 2.0, 0.5) if under_shift else (0.5, np.exp(-t) / 2.0)
    masses[0] += low_atom
    masses[-1] = high_atom
    return masses


def laplace_shift_laws(t: float, k: int = 1, grid: int = 1 << 20) -> ShiftLaws:
    """Y = sum of k i.i.d. per-coordinate Laplace log-likelihood ratios, shift t = u/b each.

    The grid step is t/m, so the atoms +-t are exact and only the interior parts (expected count
    ~ k t/2) are rounded, keeping the total rounding error ~ k t^2/(2m) independent of k.
    The k-fold convolution is one FFT power; the window is [-(k KL + s), k KL + s], where
    KL = t + e^{-t} - 1 is the mean drift and s the Hoeffding radius (range 2t per coordinate) for
    TAIL_MASS, so at most 2 TAIL_MASS per law is wrapped around (``slack``).
    """
    kl = t + np.expm1(-t)
    hoeffding = t * np.sqrt(2.0 * k * np.log(1.0 / TAIL_MASS))
    half_width = min(k * t, k * kl + hoeffding)
    m = max(1, int(t * (grid // 2) / half_width))
    half = int(np.ceil(half_width / (t / m)))
    n = scipy.fft.next_fast_len(2 * half + 1, real=True)
    idx = np.arange(-m, m + 1) % n
    slack = 0.0 if half_width >= k * t else 2.0 * TAIL_MASS

    def k_fold(masses: np.ndarray) -> np.ndarray:
        base = np.zeros(n)
        np.add.at(base, idx, masses)
        out = scipy.fft.irfft(scipy.fft.rfft(base) ** k, n)
        return np.clip(out[np.arange(-half, half + 1) % n], 0.0, None)

    p0 = k_fold(_laplace_coordinate_masses(t, m, under_shift=False))
    pv = k_fold(_laplace_coordinate_masses(t, m, under_shift=True))
    return ShiftLaws(t / m, p0, pv, slack)


#: most grid cells of a per-step privacy-loss law (float64: 1 GiB); finer loss steps are refused
MAX_LOSS_CELLS = 1 << 27


def subsampled_loss_distribution(
    laws: ShiftLaws, sample_rate: float, direction: str, step: float
) -> LossDistribution:
    """Per-step privacy loss of the Poisson-subsampled pair, rounded DOWN to the grid ``step``.

    add:    L = log(1 - q + q e^Y) under (1-q) P_0 + q P_v, increasing in Y: uses floor(Y) laws.
    remove: L = -log(1 - q + q e^Y) under P_0, decreasing in Y: uses the ceil(Y) law (mirror of pv).
    replace-one: L = Y under P_v with probability q, else 0 (the example not released): floor(Y) laws.
    """
    q = sample_rate
    y = laws.y
    with np.errstate(divide="ignore"):  # q = 1: log(1 - q) = -inf is fine in logaddexp
        mix = np.logaddexp(np.log1p(-q), np.log(q) + y)
    if direction == "add":
        loss, mass = mix, (1.0 - q) * laws.p0 + q * laws.pv
    elif direction == "remove":
        loss, mass = -mix, laws.pv[::-1]
    elif direction == "replace-one":
        loss, mass = np.append(y, 0.0), np.append(q * laws.pv, 1.0 - q)
    else:
        raise InvalidParameterError(f"direction must be 'add', 'remove' or 'replace-one', got {direction!r}")
    finite = np.isfinite(loss)
    if not finite.all():  # cells of zero mass may be dropped; any other is an error
        if np.any(mass[~finite] > 0):
            raise InvalidParameterError(
                "the per-step privacy loss is not finite on the grid (noise too small for a numerical lower bound)")
        loss, mass = loss[finite], mass[finite]
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.floor(loss / step)
    cells = float(scaled.max() - scaled.min()) + 1.0
    if not np.isfinite(cells) or cells > MAX_LOSS_CELLS:
        raise InvalidParameterError(
            f"the per-step privacy loss spans [{loss.min():.3g}, {loss.max():.3g}]: at loss step {step:.3g} that is "
            f"{cells:.3g} grid cells (at most {MAX_LOSS_CELLS}); use a larger loss step or fewer steps"
        )
    idx = scaled.astype(np.int64)
    offset = int(idx.min())
    binned = np.bincount(idx - offset, weights=mass)
    return LossDistribution(step, offset, binned, laws.slack)


def _tail_window(dist: LossDistribution, steps: int, tail: float) -> tuple[float, float]:
    """Chernoff window [lo, hi] with P(S < lo), P(S > hi) <= tail for the sum S of ``steps`` losses.

    P(S >= x) <= exp(T Lambda(lam) - lam x), Lambda(lam) = log E e^{lam L}, minimised over a lam
    grid.  Lambda is evaluated on at most ~4096 cells, rounding losses UP for the upper tail and
    DOWN for the lower tail, so both bounds stay valid for the fine law.
    """
    factor = max(1, len(dist.mass) // 4096)
    coarse = _coarsen(dist, factor)
    keep = coarse.mass > 0
    logw = np.log(coarse.mass[keep])
    down = coarse.values[keep]
    up = down + coarse.step
    lams = np.geomspace(1e-3, 1e4, 100)[:, None]
    cgf_pos = scipy.special.logsumexp(logw + lams * up, axis=1)
    cgf_neg = scipy.special.logsumexp(logw - lams * down, axis=1)
    lams = lams[:, 0]
    hi = np.min((steps * cgf_pos - np.log(tail)) / lams)
    lo = np.max((np.log(tail) - steps * cgf_neg) / lams)
    return float(lo), float(hi)


def compose(dist: LossDistribution, steps: int, max_grid: int = 1 << 24) -> LossDistribution:
    """T-fold self-composition (sum of ``steps`` i.i.d. losses) by one FFT power.

    The cyclic window is chosen from Chernoff bounds so at most 2 TAIL_MASS of the composed law can
    wrap around; slack grows to (1 + eta)^T - 1 + 2 TAIL_MASS.
    """
    if steps == 1:
        return dist
    lo, hi = _tail_window(dist, steps, TAIL_MASS)
    lo_i, hi_i = int(np.floor(lo / dist.step)), int(np.ceil(hi / dist.step))
    n = scipy.fft.next_fast_len(hi_i - lo_i + 1, real=True)
    if n > max_grid:
        raise InvalidParameterError(
            f"composition window needs {n} grid points (> max_grid={max_grid}); "
            "use a coarser loss step"
        )
    base = np.zeros(n)
    np.add.at(base, (dist.offset + np.arange(len(dist.mass))) % n, dist.mass)
    out = scipy.fft.irfft(scipy.fft.rfft(base) ** steps, n)
    composed = np.clip(out[np.arange(lo_i, lo_i + n) % n], 0.0, None)
    slack = float(np.expm1(steps * np.log1p(dist.slack))) + 2.0 * TAIL_MASS
    return LossDistribution(dist.step, lo_i, composed, slack)


def epsilon_for_delta(dist: LossDistribution, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) - slack <= delta, delta(eps) = E[(1 - e^{eps - L})_+].

    With positive loss values v_0 < v_1 < ..., on [v_{i-1}, v_i) (v_{-1} = 0) the profile is
    S1_i - e^eps S2_i with suffix sums S1_i = sum_{j>=i} p_j, S2_i = sum_{j>=i} p_j e^{-v_j}; the
    first interval whose right end is below the target holds the crossing, solved in closed form.
    """
    vals = dist.values
    pos = vals > 0
    v, p = vals[pos], dist.mass[pos]
    target = delta + dist.slack
    if len(v) == 0 or p.sum() <= target:
        return 0.0
    s1 = np.cumsum(p[::-1])[::-1]
    s2 = np.cumsum((p * np.exp(-v))[::-1])[::-1]
    left = np.concatenate(([0.0], v[:-1]))
    at_left = s1 - np.exp(left) * s2
    if at_left[0] <= target:
        return 0.0
    at_right = np.append(at_left[1:], 0.0)
    i = int(np.argmax(at_right <= target))
    eps = np.log((s1[i] - target) / s2[i])
    return float(np.clip(eps, left[i], v[i]))


def _coarsen(dist: LossDistribution, factor: int) -> LossDistribution:
    """Re-round a loss law DOWN to the grid ``factor * step`` (floor of a floor is a floor)."""
    idx = (dist.offset + np.arange(len(dist.mass))) // factor
    offset = int(idx[0])
    return LossDistribution(
        dist.step * factor, offset, np.bincount(idx - offset, weights=dist.mass), dist.slack
    )


@dataclass(frozen=True)
class PairFamily:
    """A family of worst-case neighbouring pairs, named by a mechanism's ``AuditPair``.

    ``laws(event, k, grid)``: the Y laws of its pair with support size ``k`` for the mechanism's per-step
    event (a :class:`~dpnoise.accounting.events.GaussianEvent`, ``LaplaceEvent``, ``Lap2Event``,
    ``DirichletEvent``, or another event with the fields the family reads); ``spread``: its pairs are indexed
    by a support size k = 1..n (the event's number of trained parameters), scanned by :func:`lower_bound`;
    otherwise it has the one pair k = 1.
    """

    laws: Callable[[Any, int, int], ShiftLaws]
    spread: bool = False


#: every pair family by name (see the module docstring), each added by :func:`register_pair_family`
PAIR_FAMILIES: dict[str, PairFamily] = {}


def register_pair_family(name: str, family: PairFamily) -> PairFamily:
    """Make ``family`` available to the mechanisms whose ``audit_pair`` names ``name``."""
    if name in PAIR_FAMILIES:
        raise InvalidParameterError(f"pair family {name!r} is already registered")
    PAIR_FAMILIES[name] = family
    return family


# events hold the noise relative to the sensitivity C (the Laplace b / C), so the pairs are at C = 1
register_pair_family("gaussian-shift", PairFamily(lambda event, k, grid: gaussian_shift_laws(event.noise_multiplier,
                                                                                           grid)))
register_pair_family("laplace-shift", PairFamily(
    lambda event, k, grid: laplace_shift_laws(1.0 / event.noise_multiplier, 1, grid)))
register_pair_family("laplace-spread", PairFamily(
    lambda event, k, grid: laplace_shift_laws(1.0 / (np.sqrt(k) * event.noise_multiplier), k, grid), spread=True))
register_pair_family("dirichlet-vertex", PairFamily(lambda event, k, grid: dirichlet_shift_laws(event.r, event.alpha,
                                                                                              grid)))


def shift_laws(family: str, event: Any, k: int = 1, grid: int = 1 << 20) -> ShiftLaws:
    """The Y laws of the pair ``family`` (one of :data:`PAIR_FAMILIES`, see the module docstring) for the
    per-step ``event``."""
    if family not in PAIR_FAMILIES:
        raise InvalidParameterError(f"unknown pair family {family!r}; expected one of {tuple(PAIR_FAMILIES)}")
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            laws = PAIR_FAMILIES[family].laws(event, k, grid)
    except AttributeError as err:
        raise InvalidParameterError(f"the {family} pair does not apply to {event!r}: {err}") from None
    if not (np.isfinite(laws.step) and laws.step > 0):
        raise InvalidParameterError(f"{event!r} is out of the numerical range of the {family} lower bound")
    return laws


def epsilon_lower_bound(
    laws: ShiftLaws, sample_rate: float, steps: int, delta: float,
    loss_step: float | None = None, max_grid: int = 1 << 23,
    directions: Sequence[str] = ("add", "remove"),
) -> dict[str, float]:
    """Lower bounds on eps(delta) of the subsampled, T-fold composed pair, per direction.

    ``loss_step`` (default 0.02/T, so the floor rounding costs at most ~0.02 in eps) is coarsened
    by integer factors until the composition window fits ``max_grid`` points.  ``directions``:
    ("add", "remove") for add/remove adjacency, ("replace-one",) for an output mechanism.
    """
    step = loss_step if loss_step is not None else min(1e-3, 0.02 / steps)
    out = {}
    for direction in directions:
        dist = subsampled_loss_distribution(laws, sample_rate, direction, step)
        lo, hi = _tail_window(dist, steps, TAIL_MASS)
        factor = max(1, int(np.ceil((hi - lo) / step / (0.9 * max_grid))))
        if factor > 1:
            dist = _coarsen(dist, factor)
        out[direction] = epsilon_for_delta(compose(dist, steps, max_grid), delta)
    return out


@dataclass
class BoundResult:
    """Outcome of :func:`lower_bound`: the best lower bound found and the whole k scan."""

    mechanism: str
    epsilon: float
    direction: str
    k: int
    scan: list[dict] = field(default_factory=list)


def default_k_grid(params: int, points: int = 12) -> list[int]:
    """Geometric grid of support sizes k = 1..params (distinct integers, always including both)."""
    return sorted({int(round(x)) for x in np.geomspace(1, params, points)})


def lower_bound(
    mechanism: str, noise: float, sample_rate: float, steps: int, delta: float,
    clip: float = 1.0, params: int | None = None, ks: Sequence[int] | None = None,
    grid: int = 1 << 21, loss_step: float | None = None, max_grid: int = 1 << 23,
    options: MechanismOptions | None = None, **option_fields: Any,
) -> BoundResult:
    """Best exact lower bound on eps(delta) over the feasible pairs of ``mechanism`` at ``noise`` (in its
    unit), with its options (``options`` or their fields as keywords, e.g. ``alpha=``): the pairs of
    :func:`lower_bound_of_event` for the mechanism's per-step event.  Where the mechanism's event needs the
    number of trained parameters n and only ``ks`` is given, n is the largest k (a pair with support k is
    feasible for every n >= k)."""
    spec = get_mechanism_spec(mechanism)
    if params is None and ks is not None and spec.needs_params:
        params = max(ks)
    event = spec.build_event(noise, spec.make_options(options, **option_fields), RunFacts(clip=clip, params=params))
    return lower_bound_of_event(mechanism, event, sample_rate, steps, delta, ks, grid, loss_step, max_grid)


def lower_bound_of_event(
    mechanism: str, event: Any, sample_rate: float, steps: int, delta: float, ks: Sequence[int] | None = None,
    grid: int = 1 << 21, loss_step: float | None = None, max_grid: int = 1 << 23,
) -> BoundResult:
    """Best exact lower bound on eps(delta) over the feasible pairs of ``mechanism``'s per-step ``event``.

    The pairs are its registered ``audit_pair``.  For a spread family (``laplace-spread``, lap2) they are
    the shifts (C/sqrt(k))(1,..,1,0,..) for k in ``ks`` (default: a geometric grid up to the event's
    ``num_params``); every other family has one pair.  Gradient mechanisms: both directions of add/remove
    adjacency; output mechanisms: replace-one adjacency with each sampled example's output released.  The
    maximum over pairs and directions is reported.
    """
    spec = get_mechanism_spec(mechanism)
    family = spec.audit_pair.family
    directions = ("replace-one",) if spec.perturbs == "outputs" else ("add", "remove")
    if family not in PAIR_FAMILIES:
        raise InvalidParameterError(f"mechanism {mechanism!r} names pair family {family!r}, which is not "
                                    f"registered; choose from {tuple(PAIR_FAMILIES)}")
    if PAIR_FAMILIES[family].spread:
        params = event.num_params
        ks = default_k_grid(params) if ks is None else ks
        if max(ks) > params:
            raise InvalidParameterError(f"k = {max(ks)} exceeds the number of parameters {params}")
    else:
        ks = [1]
    step = loss_step if loss_step is not None else min(1e-3, 0.02 / steps)
    coarse = len(ks) > 1  # scan all k coarsely (still valid lower bounds), refine the worst one
    scan = []
    for k in ks:
        laws = shift_laws(family, event, k, grid // 8 if coarse else grid)
        eps = epsilon_lower_bound(laws, sample_rate, steps, delta, 4 * step if coarse else step, max_grid,
                                  directions)
        scan.extend({"k": int(k), "direction": d, "epsilon": e, "coarse": coarse} for d, e in eps.items())
    if coarse:
        worst = max(scan, key=lambda row: row["epsilon"])["k"]
        laws = shift_laws(family, event, worst, grid)
        eps = epsilon_lower_bound(laws, sample_rate, steps, delta, step, max_grid, directions)
        scan.extend({"k": worst, "direction": d, "epsilon": e, "coarse": False} for d, e in eps.items())
    best = max(scan, key=lambda row: row["epsilon"])
    return BoundResult(mechanism, best["epsilon"], best["direction"], best["k"], scan)
