"""Empirical audit of the library's own clipping and noise sampler on a canary pair.

Neighbouring batches D (B known examples) and D' = D + canary.  The canary's raw gradient is
``overshoot`` times the clipping norm in the worst-case direction (so clipping must act), and the
auditor, who knows the other examples, tests the released noisy sum with the exact likelihood
ratio of the CLAIMED mechanism (shift v = clipped canary, claimed noise scale):

* Laplace (lap2, laplace-l1): Y = sum_i (|x_i| - |x_i - v_i|)/b;
* Gaussian: Y = (<x, v> - |v|^2/2)/(sigma C)^2.

Y is rounded to 1e-9 first: the test must not read the floating-point low-order bits of the
released sum (which do leak, Mironov 2012, and are out of scope here: the samplers document that
they do not defend against floating-point attacks).  A threshold on Y gives FPR/FNR, turned into an epsilon lower bound with Clopper–Pearson confidence
(:func:`dpnoise.audit.stats.threshold_audit`).  If the sampler or the clipping is wrong (too little
noise, wrong scale, no clipping), the bound exceeds the accountants' claims.  One unsampled step
(q = 1, T = 1) is audited: it isolates sampling and scaling bugs with the most statistical power.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from dpnoise.accounting import MECHANISMS, get_mechanism_spec
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.audit.claims import audit_record, claimed_epsilons
from dpnoise.audit.stats import threshold_audit
from dpnoise.mechanisms import clip_factors, clipped_sum, get_mechanism, per_example_norms
from dpnoise.mechanisms.registry import NoiseSampler

__all__ = ["canary_direction", "likelihood_ratio", "audit_sampler"]

#: the mechanisms whose released value is a noisy sum of clipped per-example gradients
GRADIENT_MECHANISMS = tuple(name for name, spec in sorted(MECHANISMS.items()) if spec.perturbs == "gradients")


def canary_direction(mechanism: str, dim: int) -> np.ndarray:
    """Unit vector (in the mechanism's clipping norm) of the worst-case canary shift.

    L2 clipping: (1,..,1)/sqrt(dim) (for Laplace noise the k = dim shift of docs/theory/lap2.md §3; for
    Gaussian noise every L2 direction is equivalent); L1 clipping: e_1 (the 1-D shift).
    """
    if get_mechanism_spec(mechanism).clip_norm_ord == 1:
        return np.eye(1, dim).ravel()
    return np.full(dim, 1.0 / np.sqrt(dim))


#: decimals kept of the test statistic (drops floating-point artefacts, see the module docstring)
SCORE_DECIMALS = 9


def likelihood_ratio(mechanism: str, x: np.ndarray, shift: np.ndarray, noise: float, clip: float) -> np.ndarray:
    """log(p_shift(x)/p_0(x)) per row of ``x`` under the claimed noise, rounded to 1e-9."""
    if get_mechanism_spec(mechanism).noise_distribution == "gaussian":
        score = (x @ shift - shift @ shift / 2.0) / np.float64(noise * clip) ** 2  # inf, not OverflowError
    else:
        score = (np.abs(x) - np.abs(x - shift)).sum(axis=1) / noise
    return np.round(score, SCORE_DECIMALS)


def audit_sampler(
    mechanism: str, noise: float, delta: float = 1e-5, clip: float = 1.0, dim: int = 16,
    trials: int = 200_000, batch: int = 4, overshoot: float = 10.0, confidence: float = 0.95,
    seed: int = 0, sample_noise: Optional[NoiseSampler] = None,
) -> dict:
    """Run the real clipping + noise ``trials`` times per side and audit the claimed epsilon.

    ``sample_noise`` replaces the registered sampler (to audit a candidate implementation).
    Returns claimed_epsilon (strictest sound accountant), epsilon_by_accountant,
    lower_bound_epsilon, confidence, consistent, and the test's rates.
    """
    if mechanism not in GRADIENT_MECHANISMS:
        raise InvalidParameterError(f"sampler audit supports {GRADIENT_MECHANISMS}, got {mechanism!r}")
    mech = get_mechanism(mechanism)
    sampler = sample_noise or mech.sample_noise
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    direction = canary_direction(mechanism, dim)
    others = rng.normal(size=(batch, dim)) * clip
    canary = overshoot * clip * direction

    def released(grads: np.ndarray) -> np.ndarray:
        g = torch.as_tensor(grads, dtype=torch.float64)
        factors = clip_factors(per_example_norms([g], mech.clip_norm_ord), clip)
        total = clipped_sum(g, factors)
        reference = torch.zeros((trials, dim), dtype=torch.float64)
        return (total + sampler(reference, noise, clip, gen)).numpy()

    # the auditor's own (exact) clipping of the known examples
    norms = np.linalg.norm(others, ord=mech.clip_norm_ord, axis=1, keepdims=True)
    known = (others * np.minimum(1.0, clip / norms)).sum(axis=0)
    shift = clip * direction
    null = likelihood_ratio(mechanism, released(others) - known, shift, noise, clip)
    alt = likelihood_ratio(mechanism, released(np.vstack([others, canary])) - known, shift, noise, clip)
    test = threshold_audit(null, alt, delta, confidence)
    claims = claimed_epsilons(mechanism, noise, 1.0, 1, delta, clip=clip, params=dim)
    return audit_record("sampler", mechanism, noise, 1.0, 1, delta, claims, test.epsilon, confidence,
                        clip=clip, dim=dim, test=test.as_dict())
