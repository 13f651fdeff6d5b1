"""Statistics that turn attack outcomes into epsilon LOWER bounds with stated confidence.

* Clopper–Pearson (1934) exact binomial confidence bounds (via the Beta quantile function).
* Hypothesis-testing view of (eps, delta)-DP (Kairouz, Oh, Viswanath 2015): every test between
  neighbouring outputs has FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta, so
  eps >= log((1 - delta - FPR)/FNR) and eps >= log((1 - delta - FNR)/FPR).
* One-run auditing (Steinke, Nasr, Jagielski 2023, Thm. 3): with m canaries included i.i.d. w.p.
  1/2 and r guesses, the number W of correct guesses of an (eps, delta)-DP algorithm satisfies
  P[W >= v] <= f(v) + 2 m delta max_{1<=i<=m} (f(v - i) - f(v))/i, f(v) = P[Bin(r, e^eps/(1+e^eps)) >= v].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.optimize
from scipy.stats import beta, binom

__all__ = [
    "clopper_pearson_upper",
    "clopper_pearson_lower",
    "epsilon_from_rates",
    "ThresholdAudit",
    "threshold_audit",
    "one_run_p_value",
    "one_run_epsilon",
]


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided upper (1 - alpha) Clopper–Pearson bound on a binomial proportion."""
    if successes >= trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided lower (1 - alpha) Clopper–Pearson bound on a binomial proportion."""
    if successes <= 0:
        return 0.0
    return float(beta.ppf(alpha, successes, trials - successes + 1))


def epsilon_from_rates(fpr: float, fnr: float, delta: float) -> float:
    """Largest eps the hypothesis-testing inequalities force for error rates (fpr, fnr), >= 0."""
    with np.errstate(divide="ignore"):
        candidates = [
            np.log(max(1.0 - delta - fpr, 0.0)) - np.log(fnr),
            np.log(max(1.0 - delta - fnr, 0.0)) - np.log(fpr),
        ]
    return float(max(0.0, *candidates))


@dataclass(frozen=True)
class ThresholdAudit:
    """Outcome of a threshold distinguisher: the rates behind the bound and the bound itself."""

    threshold: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    epsilon: float
    confidence: float
    trials: int

    def as_dict(self) -> dict:
        return asdict(self)


def _rates(null: np.ndarray, alt: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """False-positive counts P(null > tau) and false-negative counts P(alt <= tau), per threshold."""
    null_s, alt_s = np.sort(null), np.sort(alt)
    fp = len(null_s) - np.searchsorted(null_s, thresholds, side="right")
    fn = np.searchsorted(alt_s, thresholds, side="right")
    return fp, fn


def threshold_audit(
    null_scores: np.ndarray, alt_scores: np.ndarray, delta: float, confidence: float = 0.95,
    select_fraction: float = 0.5,
) -> ThresholdAudit:
    """Epsilon lower bound of the test "score > tau" between the two output distributions.

    The threshold is chosen on the first ``select_fraction`` of each sample (maximising the
    epsilon implied by the point estimates), and the bound is computed on the held-out rest with
    one-sided Clopper–Pearson upper bounds on FPR and FNR at (1 - confidence)/2 each (union bound),
    so the reported epsilon is a lower bound with probability >= ``confidence``.
    """
    n_sel = int(len(null_scores) * select_fraction)
    m_sel = int(len(alt_scores) * select_fraction)
    sel_null, sel_alt = null_scores[:n_sel], alt_scores[:m_sel]
    test_null, test_alt = null_scores[n_sel:], alt_scores[m_sel:]
    candidates = np.unique(np.quantile(np.concatenate([sel_null, sel_alt]), np.linspace(0, 1, 513)))
    fp, fn = _rates(sel_null, sel_alt, candidates)
    # add-one smoothing keeps zero counts from looking infinitely informative during selection
    point = [epsilon_from_rates((a + 1) / (n_sel + 2), (b + 1) / (m_sel + 2), delta) for a, b in zip(fp, fn)]
    tau = float(candidates[int(np.argmax(point))])
    fp_t, fn_t = _rates(test_null, test_alt, np.array([tau]))
    alpha = (1.0 - confidence) / 2.0
    fpr_u = clopper_pearson_upper(int(fp_t[0]), len(test_null), alpha)
    fnr_u = clopper_pearson_upper(int(fn_t[0]), len(test_alt), alpha)
    return ThresholdAudit(
        threshold=tau,
        fpr=float(fp_t[0]) / len(test_null),
        fnr=float(fn_t[0]) / len(test_alt),
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        epsilon=epsilon_from_rates(fpr_u, fnr_u, delta),
        confidence=confidence,
        trials=len(test_null) + len(test_alt),
    )


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[W >= correct] bound of Steinke, Nasr, Jagielski (2023) Thm. 3 under (eps, delta)-DP."""
    p = 1.0 / (1.0 + np.exp(-epsilon))
    f = binom.sf(np.arange(correct - canaries, correct + 1) - 1, guesses, p)  # f(v - i), i = m..0
    f_v = f[-1]
    i = np.arange(canaries, 0, -1)
    excess = np.max((f[:-1] - f_v) / i) if canaries > 0 else 0.0
    return float(min(1.0, f_v + 2.0 * canaries * delta * excess))


def one_run_epsilon(
    canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """Largest eps whose p-value for ``correct`` of ``guesses`` is still <= 1 - confidence."""
    level = 1.0 - confidence

    def excess(eps: float) -> float:
        return one_run_p_value(canaries, guesses, correct, eps, delta) - level

    if excess(0.0) > 0:
        return 0.0
    hi = 1.0
    while excess(hi) <= 0 and hi < 100:
        hi *= 2
    return float(scipy.optimize.brentq(excess, 0.0, hi, xtol=1e-6)) if excess(hi) > 0 else hi
