"""Training-level audits: one-run canary auditing and the Dirichlet parameter-leakage test.

1. :func:`audit_one_run` -- Steinke, Nasr, Jagielski (2023), "Privacy auditing with one (1)
   training run", white-box gradient canaries.  A softmax regression on generated data is trained
   with the library's own DP optimizer (:class:`dpnoise.training.optimizers.NoisyGradientOptimizer`:
   its clipping, noise, scaling).  The features get ``canaries`` extra zero columns; canary i has
   a Dirac per-example gradient (``overshoot`` x C in weight [0, d + i], so clipping must act) and is
   included in the training set with probability 1/2.  The auditor sees every iterate, recovers the
   noisy gradient of each canary coordinate and scores canary i by the subsampled log-likelihood
   ratio sum_t log(1 - q + q e^{Y_t}) of the claimed noise; it guesses "in" for the top and "out"
   for the bottom scores and converts the number of correct guesses into an epsilon lower bound
   (:func:`dpnoise.audit.stats.one_run_epsilon`).
2. :func:`audit_dirichlet_leakage` -- docs/theory/dirichlet.md §5.  One Dirichlet-mechanism SGD step on a
   batch of B known examples, with or without the target.  The head's update lies in the span of
   the included examples' penultimate features, so an adversary who knows the others measures the
   update's component outside their span: zero without the target, non-zero with it.  The
   threshold test's epsilon lower bound is reported next to the Dirichlet accountant's epsilon,
   which covers the released outputs only, NOT the parameters.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dpnoise.accounting import OUTPUT_PRIVACY_SCOPE
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.audit.claims import audit_record, claimed_epsilons
from dpnoise.audit.sampler import likelihood_ratio
from dpnoise.audit.stats import one_run_epsilon, threshold_audit
from dpnoise.mechanisms import DirichletOutput, get_mechanism
from dpnoise.mechanisms.release import FloatRelease
from dpnoise.training.optimizers import NoisyGradientOptimizer
from dpnoise.training.privacy_units import PrivacyUnits
from dpnoise.training.provenance import DrawnBatch
from dpnoise.training.sampling import LogicalBatchTracker

__all__ = ["audit_one_run", "audit_dirichlet_leakage"]

#: decimals kept of recovered gradients / scores (no floating-point low-order-bit attacks)
SCORE_DECIMALS = 6


class _CountingGate:
    """Step gate that admits every step and counts the recorded ones."""

    def __init__(self) -> None:
        self.steps = 0

    def admit_step(self) -> bool:
        return True

    def record_step(self) -> None:
        self.steps += 1


def _generated_data(n: int, dim: int, classes: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian class clusters: n examples, ``dim`` features, labels 0..classes-1."""
    labels = rng.integers(classes, size=n)
    centres = rng.normal(size=(classes, dim)) * 2.0
    x = centres[labels] + rng.normal(size=(n, dim))
    return torch.as_tensor(x), torch.as_tensor(labels)


def _softmax_regression_grads(weight: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example gradients of the cross-entropy of softmax(W x): (softmax - onehot) outer x."""
    err = torch.softmax(x @ weight.T, dim=1)
    err[torch.arange(len(y)), y] -= 1.0
    return err[:, :, None] * x[:, None, :]


def audit_one_run(
    mechanism: str = "gaussian", noise: float = 1.0, clip: float = 1.0, sample_rate: float = 0.5,
    steps: int = 20, canaries: int = 1000, guesses: int = 200, delta: float = 1e-5,
    confidence: float = 0.95, examples: int = 200, features: int = 8, classes: int = 2,
    lr: float = 0.5, overshoot: float = 5.0, seed: int = 0, canary_examples: int = 1, unit_clipping: bool = True,
) -> dict:
    """One-run white-box canary audit of DP-SGD training with ``mechanism`` (gaussian, lap2, laplace-l1).

    ``canary_examples`` m > 1 audits privacy units (:mod:`dpnoise.training.privacy_units`): each canary is a
    user of m examples with the same Dirac gradient, sampled and (``unit_clipping``) clipped together; with
    ``unit_clipping=False`` each example is clipped alone, the control in which the per-unit claim fails.
    """
    mech = get_mechanism(mechanism)
    if not mech.needs_per_sample_gradients:
        raise InvalidParameterError(f"one-run audit needs a gradient mechanism, got {mechanism!r}")
    if not isinstance(canary_examples, int) or canary_examples < 1:
        raise InvalidParameterError(f"canary_examples must be an integer >= 1, got {canary_examples!r}")
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    x_real, y_real = _generated_data(examples, features, classes, rng)
    x_real = torch.cat([x_real, torch.zeros(examples, canaries, dtype=x_real.dtype)], dim=1)
    width = features + canaries
    canary_grads = torch.zeros(canaries, classes, width, dtype=torch.float64)
    canary_grads[torch.arange(canaries), 0, features + torch.arange(canaries)] = overshoot * clip
    canary_grads = canary_grads.repeat_interleave(canary_examples, 0)  # canary i's m examples
    included = rng.random(canaries) < 0.5

    model = nn.Linear(width, classes, bias=False).double()
    gate = _CountingGate()
    expected_batch = sample_rate * (examples + included.sum() * canary_examples)
    batches = LogicalBatchTracker()
    opt = NoisyGradientOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr), mechanism=mech,
        release=FloatRelease(mech.sample_noise, noise, clip, gen), max_grad_norm=clip,
        expected_batch_size=expected_batch, gate=gate, logical_batches=batches,
    )
    if unit_clipping and canary_examples > 1:  # real example i is unit i, canary j's examples unit examples + j
        units = np.concatenate([np.arange(examples), examples + np.arange(canaries).repeat(canary_examples)])
        opt.noisy_sum.privacy_units = PrivacyUnits(units, len(units))
    coords = (0, features + np.arange(canaries))
    scores = np.zeros(canaries)
    for _ in range(steps):
        real = rng.random(examples) < sample_rate
        canary = included & (rng.random(canaries) < sample_rate)
        before = model.weight.detach()[coords].clone().numpy()
        with torch.no_grad():
            per_example = _softmax_regression_grads(model.weight, x_real[real], y_real[real])
        canary_rows = np.flatnonzero(canary.repeat(canary_examples))
        model.weight.grad_sample = torch.cat([per_example, canary_grads[canary_rows]])
        batches.queue(DrawnBatch([*np.flatnonzero(real), *(examples + canary_rows)], draw=gate.steps, piece=0, pieces=1))
        batches.advance()
        opt.step()
        opt.zero_grad()
        after = model.weight.detach()[coords].numpy()
        noisy = np.round((before - after) * expected_batch / lr, SCORE_DECIMALS)
        y = likelihood_ratio(mechanism, noisy[:, None], np.array([clip]), noise, clip)
        scores += np.logaddexp(np.log1p(-sample_rate), np.log(sample_rate) + y) if sample_rate < 1 else y
    order = np.argsort(scores)
    half = guesses // 2
    correct = int(included[order[-half:]].sum() + (~included[order[:half]]).sum())
    lower = one_run_epsilon(canaries, 2 * half, correct, delta, confidence)
    params = classes * width
    claims = claimed_epsilons(mechanism, noise, sample_rate, steps, delta, clip=clip, params=params)
    return audit_record("training", mechanism, noise, sample_rate, gate.steps, delta, claims, lower, confidence,
                        clip=clip, params=params, canaries=canaries, guesses=2 * half, correct=correct,
                        **({"canary_examples": canary_examples, "unit_clipping": unit_clipping}
                           if canary_examples > 1 else {}))


def audit_dirichlet_leakage(
    r: float = 0.1, alpha: float = 1.0, trials: int = 400, batch: int = 8, features: int = 32,
    inputs: int = 16, classes: int = 10, delta: float = 1e-5, confidence: float = 0.95, seed: int = 0,
) -> dict:
    """Membership test on one Dirichlet-mechanism update (docs/theory/dirichlet.md §5), ``trials`` per side.

    The feature map h(x) = tanh(A x) is fixed; the head W (classes x features) takes one SGD step on
    the summed loss -log p~_y.  Score: ||dW (I - P)||_F / ||dW||_F, P the projector onto the span
    of the other batch members' features.  Requires batch < features (the leaking regime).
    """
    if batch >= features:
        raise InvalidParameterError("the span test needs batch < features (otherwise the others span everything)")
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    feature_map = nn.Sequential(nn.Linear(inputs, features), nn.Tanh()).double().requires_grad_(False)
    head = nn.Linear(features, classes, bias=False).double()
    model = DirichletOutput(nn.Sequential(feature_map, head), r=r, alpha=alpha, generator=gen).train()

    def score(with_target: bool) -> float:
        x = torch.as_tensor(rng.normal(size=(batch + 1, inputs)))
        y = torch.as_tensor(rng.integers(classes, size=batch + 1))
        members = slice(0, batch + 1) if with_target else slice(1, batch + 1)
        head.zero_grad()
        nn.functional.nll_loss(model(x[members]), y[members], reduction="sum").backward()
        update = head.weight.grad.numpy()
        others = feature_map(x[1:]).numpy()  # the adversary knows the other examples
        basis, _ = np.linalg.qr(others.T)
        outside = update - (update @ basis) @ basis.T
        return round(float(np.linalg.norm(outside) / (np.linalg.norm(update) + 1e-300)), SCORE_DECIMALS)

    null = np.array([score(False) for _ in range(trials)])
    alt = np.array([score(True) for _ in range(trials)])
    test = threshold_audit(null, alt, delta, confidence)
    claims = claimed_epsilons("dirichlet", r, 1.0, 1, delta, alpha=alpha)
    return audit_record("dirichlet-leakage", "dirichlet", r, 1.0, 1, delta, claims, test.epsilon, confidence,
                        alpha=alpha, batch=batch, features=features, test=test.as_dict(), scope=OUTPUT_PRIVACY_SCOPE)
