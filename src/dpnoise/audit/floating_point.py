"""Floating-point attack on a noisy sum (Mironov, "On significance of the least significant bits for
differential privacy", CCS 2012): the low-order bits of the release tell neighbouring inputs apart.

**Lemma** (docs/theory/secure_noise.md §4).  Let c != 0 and n be floats of one binary format and
y = fl(c + n) rounded to nearest.  If |y| < |c|, then y is an integer multiple of ulp(c)/2.

So when a release is computed as fl(x + noise) (``S + laplace_noise(...)``, as the plain samplers
of :mod:`dpnoise.mechanisms.noise` are used), every output of the input x_i = c_i that is smaller
than |c_i| lies on the grid (ulp(c_i)/2) Z, whereas with x_i = 0 the output IS the noise, whose
magnitude below |c_i| has finer bits almost always.  The distinguisher :func:`grid_escape` ("some
coordinate i with c_i != 0 has |y_i| < |c_i| off that grid") therefore never fires on the shifted
input, by the lemma, and fires with probability near 1 on the other: no finite epsilon holds with
delta below that probability, whatever the accountant says.

:func:`audit_floating_point` runs the distinguishers on a release function for the neighbouring
clipped sums 0 and the canary shift (one unsampled step, as :func:`dpnoise.audit.audit_sampler`),
and turns the rates into an epsilon lower bound with Clopper-Pearson confidence.  The secure
samplers of :mod:`dpnoise.mechanisms.secure_noise` release multiples of a power-of-two grid, and
the same distinguishers find nothing beyond what epsilon allows.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from dpnoise.accounting.validation import InvalidParameterError, check_count, check_delta, check_positive
from dpnoise.audit.claims import audit_record, claimed_epsilons
from dpnoise.audit.sampler import GRADIENT_MECHANISMS, canary_direction
from dpnoise.audit.stats import clopper_pearson_lower, clopper_pearson_upper

__all__ = ["grid_escape", "lowest_bit_parity", "DISTINGUISHERS", "rate_epsilon", "audit_floating_point"]

#: (clipped sums, one row per trial) -> the released noisy sums, same shape and dtype
Release = Callable[[torch.Tensor], torch.Tensor]


def _ulp(values: np.ndarray) -> np.ndarray:
    """The unit in the last place of each (finite) value, in its own dtype."""
    return np.spacing(np.abs(values))


def grid_escape(released: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Per row of ``released``: does some coordinate i with shift_i != 0 have |y_i| < |shift_i| and
    y_i off the grid (ulp(shift_i)/2) Z?  By the lemma of the module docstring, never when the
    release is fl(shift + noise)."""
    shift = np.asarray(shift, dtype=released.dtype)
    step = _ulp(shift) / 2  # exact: a power of two
    with np.errstate(invalid="ignore", divide="ignore"):
        off_grid = np.fmod(released, np.where(shift != 0, step, 1)) != 0
    below = np.abs(released) < np.abs(shift)
    return np.any(off_grid & below & (shift != 0), axis=1)


def lowest_bit_parity(released: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Per row: is the exponent j of the lowest set bit of y_i odd (y_i = odd * 2^j), for the first
    coordinate i with shift_i != 0?  A parameter-free low-order-bit statistic; 0 counts as even."""
    i = int(np.flatnonzero(np.asarray(shift) != 0)[0])
    fraction, exponent = np.frexp(np.asarray(released[:, i], dtype=np.float64))  # exact for every float dtype
    significand = np.abs(fraction * 2.0 ** 53).astype(np.int64)
    lowest = np.log2((significand & -significand).astype(np.float64), where=significand != 0,
                     out=np.zeros(significand.shape))
    return (significand != 0) & ((exponent - 53 + lowest.astype(np.int64)) % 2 == 1)


#: the distinguishers run by :func:`audit_floating_point`, by name
DISTINGUISHERS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "grid_escape": grid_escape,
    "lowest_bit_parity": lowest_bit_parity,
}


def rate_epsilon(hits_first: int, hits_second: int, trials: int, delta: float, alpha: float) -> float:
    """Epsilon lower bound from an event seen ``hits_first`` / ``hits_second`` times in ``trials``
    runs on each input: (eps, delta)-DP needs P_1(A) <= e^eps P_2(A) + delta both ways, so
    eps >= log((lower(P_1) - delta) / upper(P_2)) with one-sided Clopper-Pearson bounds at level
    ``alpha`` each (and the same with the inputs swapped); 0 when nothing is shown."""
    bound = 0.0
    for hits_a, hits_b in ((hits_first, hits_second), (hits_second, hits_first)):
        gap = clopper_pearson_lower(hits_a, trials, alpha) - delta
        if gap > 0:
            bound = max(bound, float(np.log(gap) - np.log(clopper_pearson_upper(hits_b, trials, alpha))))
    return bound


def audit_floating_point(
    release: Release, mechanism: str, noise: float, clip: float = 1.0, dim: int = 16,
    trials: int = 100_000, delta: float = 1e-5, confidence: float = 0.95, dtype: torch.dtype = torch.float64,
) -> dict:
    """Run the low-order-bit distinguishers on ``release`` for the clipped sums 0 and the canary
    shift ``clip * canary_direction(mechanism, dim)`` (``trials`` releases each) and audit the
    claimed epsilon of one unsampled step.

    ``release`` gets a (trials, dim) tensor of clipped sums in ``dtype`` and returns the released
    values (e.g. ``lambda s: s + laplace_noise(s, b, clip, generator)``, or
    ``lambda s: secure_noisy_sum(s, plan, bits)`` with a plan for ``dim`` coordinates).  The
    confidence is shared by the 2 x len(DISTINGUISHERS) one-sided bounds (union bound).
    Returns :func:`~dpnoise.audit.claims.audit_record`'s fields plus, per distinguisher, its hits
    on each input and its bound.
    """
    if mechanism not in GRADIENT_MECHANISMS:
        raise InvalidParameterError(f"floating-point audit supports {GRADIENT_MECHANISMS}, got {mechanism!r}")
    noise, clip = check_positive("noise", noise), check_positive("clip", clip)
    dim, trials = check_count("dim", dim, 1), check_count("trials", trials, 1)
    delta = check_delta("delta", delta)
    if not 0 < confidence < 1:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence!r}")
    shift = torch.as_tensor(clip * canary_direction(mechanism, dim), dtype=dtype)
    inputs = {"without": torch.zeros((trials, dim), dtype=dtype), "with": shift.expand(trials, dim).clone()}
    outputs = {side: release(sums).detach().cpu().numpy() for side, sums in inputs.items()}
    alpha = (1.0 - confidence) / (2 * len(DISTINGUISHERS))
    shift_np = shift.numpy()
    tests = {}
    for name, distinguisher in DISTINGUISHERS.items():
        hits = {side: int(distinguisher(out, shift_np).sum()) for side, out in outputs.items()}
        tests[name] = {"hits_without": hits["without"], "hits_with": hits["with"],
                       "epsilon": rate_epsilon(hits["without"], hits["with"], trials, delta, alpha)}
    lower = max(test["epsilon"] for test in tests.values())
    claims = claimed_epsilons(mechanism, noise, 1.0, 1, delta, clip=clip, params=dim)
    return audit_record("floating_point", mechanism, noise, 1.0, 1, delta, claims, lower, confidence,
                        clip=clip, dim=dim, trials=trials, dtype=str(dtype).removeprefix("torch."),
                        distinguishers=tests)
