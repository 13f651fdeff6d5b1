"""Floating-point-safe noisy sums (secure mode): exact integer noise on a power-of-two grid.

The float samplers of :mod:`dpnoise.mechanisms.noise` add ``b (E1 - E2)`` or a Gaussian in floating
point; the set of floats ``x + noise`` can reach depends on ``x``, so the low-order bits of a
release tell neighbouring inputs apart (Mironov, CCS 2012; :mod:`dpnoise.audit.floating_point`).
Here the release is computed in integers instead:

    released = grid * (round(S / grid) + Z)

with ``S`` the sum of clipped gradients, ``grid`` a power of two and ``Z`` an integer vector drawn
EXACTLY from uniform random bytes, with only integer arithmetic (no floating point touches the
noise).  Every release is a multiple of ``grid`` whatever ``S`` is, and its law is the one the
proofs of docs/theory/secure_noise.md assume:

* Laplace (lap2, laplace-l1): ``Z_i = floor(L_i)``, ``L_i ~ Lap(0, t)`` (:func:`floored_laplace`);
* Gaussian: ``Z_i`` discrete Gaussian ``N_Z(0, t w)`` (:func:`discrete_gaussian`, Canonne, Kamath &
  Steinke, arXiv 2004.00010, Algorithm 3).

Their parameters (grid, t, w) come from :mod:`dpnoise.accounting.secure_noise`, which also says
what the accountants are told.  The random bytes come from a :class:`RandomBits` source: the
operating system's CSPRNG (:class:`SystemRandomBits`, the default) or a SHAKE-256 stream keyed
with a secret (:class:`Shake256RandomBits`, reproducible by whoever holds the key).  Everything is
computed on the CPU in int64, then the release is cast to the sum's dtype and moved to its device
(post-processing: it changes nothing to the privacy).

The samplers are vectorised loops: each round costs a few tensor operations on the coordinates
still pending, rejection samplers draw their proposals in batches (:func:`_accepted`), and a
uniform byte decides a Bernoulli with probability 255/256 (:func:`bernoulli_rational`), so a
coordinate costs about 12 random bytes (Laplace) or 21 (Gaussian), benchmarks/bench_secure_noise.py.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Callable, Optional, Protocol, Sequence, Union

import torch

from dpnoise.accounting.secure_noise import (
    DiscreteGaussianPlan,
    DiscreteLaplacePlan,
    plan_discrete_gaussian,
    plan_discrete_laplace,
)
from dpnoise.accounting.validation import InvalidParameterError, check_count
from dpnoise.errors import DpnoiseError

__all__ = [
    "RandomBits",
    "SystemRandomBits",
    "Shake256RandomBits",
    "SecureNoiseError",
    "bernoulli_rational",
    "bernoulli_exp",
    "geometric",
    "discrete_laplace",
    "discrete_gaussian",
    "floored_laplace",
    "secure_noisy_sum",
    "secure_noisy_sums",
    "secure_laplace_sum",
    "secure_gaussian_sum",
]

Plan = Union[DiscreteLaplacePlan, DiscreteGaussianPlan]

#: |S / grid| is clamped to 2^52 before rounding (a contraction: the sensitivity does not grow), so
#: round(S / grid) + Z stays below 2^63 for every Z the samplers return
SUM_LIMIT = 2.0 ** 52
#: a geometric count V of Bern(e^-1) successes above this is refused: it has probability
#: e^{-2^21}, and t V stays in int64 for every t the plans allow (t <= 2^40)
GEOMETRIC_LIMIT = 2 ** 21
#: |u| below this has u^2 < 2^62 (int64); the discrete Gaussian's rare larger |u| is squared in
#: Python integers
SQUARE_LIMIT = 2 ** 31
#: coordinates processed at once by :func:`secure_noisy_sums` (bounds the memory of the int64 work)
CHUNK = 1 << 20
#: acceptance rates that size the proposal batches (only the speed depends on them): the uniform
#: U of :func:`geometric` is kept with probability E[e^{-U/t}] >= 1 - 1/e; CKS Algorithm 3 keeps
#: about e^{-1/2} sqrt(pi/2) = 0.76 of its proposals at large sigma
_ACCEPT_EXP = -math.expm1(-1.0)
_ACCEPT_GAUSSIAN = 0.7


class SecureNoiseError(DpnoiseError, RuntimeError):
    """The secure sampler cannot release this sum exactly (non-finite entries, unreachable state)."""


class RandomBits(Protocol):
    """A source of independent uniform random bytes."""

    def random_bytes(self, count: int) -> torch.Tensor:
        """``count`` uniform bytes as a CPU ``torch.uint8`` tensor."""


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class SystemRandomBits:
    """The operating system's cryptographically secure generator (``os.urandom``: getrandom(2) on
    Linux).  Nothing to seed, nothing to checkpoint: every draw is fresh and secret."""

    def random_bytes(self, count: int) -> torch.Tensor:
        return _as_tensor(os.urandom(count))


class Shake256RandomBits:
    """SHAKE-256 (FIPS 202) as a stream keyed with ``key`` (at least 32 bytes): call i returns the
    first ``count`` bytes of SHAKE-256(key || i as 8 little-endian bytes).

    Secure while the key is secret (the key IS the noise: whoever holds it can regenerate every
    draw); reproducible from (key, :attr:`calls`).  Tests use it with a fixed key.
    """

    def __init__(self, key: bytes, calls: int = 0):
        if not isinstance(key, (bytes, bytearray)) or len(key) < 32:
            raise InvalidParameterError("key must be at least 32 bytes (e.g. os.urandom(32))")
        self._key = bytes(key)
        self.calls = check_count("calls", calls)

    def random_bytes(self, count: int) -> torch.Tensor:
        block = hashlib.shake_256(self._key + self.calls.to_bytes(8, "little")).digest(count) if count else b""
        self.calls += 1
        return _as_tensor(block)


def _checked(drawn: torch.Tensor, count: int) -> torch.Tensor:
    """``drawn`` if it is ``count`` contiguous CPU uint8 values, else an error."""
    if drawn.dtype != torch.uint8 or drawn.numel() != count or drawn.device.type != "cpu" or not drawn.is_contiguous():
        raise SecureNoiseError(f"the random-bit source returned {drawn.numel()} {drawn.dtype} values on "
                               f"{drawn.device}, {count} contiguous uint8 on the CPU expected")
    return drawn


def _bytes(bits: RandomBits, count: int) -> torch.Tensor:
    """``count`` uniform values in [0, 256) as int64."""
    return _checked(bits.random_bytes(count), count).to(torch.int64)


def _fair_bits(bits: RandomBits, count: int) -> torch.Tensor:
    """``count`` independent fair booleans (8 per byte)."""
    drawn = _bytes(bits, (count + 7) // 8)
    shifts = torch.arange(8, dtype=torch.int64)
    return ((drawn[:, None] >> shifts) & 1).reshape(-1)[:count].bool()


def _where(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries (int64, 1-D)."""
    return torch.nonzero(mask).view(-1)


def _accepted(count: int, propose: Callable[[int], tuple[torch.Tensor, torch.Tensor]], acceptance: float
              ) -> torch.Tensor:
    """The first ``count`` accepted values of a sequence of independent proposals.

    ``propose(size)`` returns ``size`` proposals and whether each is accepted.  The accepted values,
    in order, are independent draws of the target law (rejection sampling), so the first ``count``
    of them are too; the batches are sized by the expected ``acceptance`` rate plus a margin, so
    that one batch usually suffices (fewer rounds over ever smaller remainders).
    """
    parts, needed = [], count
    while needed > 0:
        values, kept = propose(int(needed / acceptance * 1.05) + 16)
        parts.append(values[kept][:needed])
        needed -= parts[-1].numel()
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def _uniform_below(bits: RandomBits, count: int, bound: int) -> torch.Tensor:
    """``count`` exact uniforms on {0, ..., bound - 1}, bound < 2^56.

    bound <= 2^31: Lemire's multiply-shift ("Fast random integer generation in an interval", ACM
    TOMACS 2019): x uniform on [0, 2^32), value = (x bound) >> 32, redrawn when the low 32 bits of
    x bound are below 2^32 mod bound (each value then has exactly floor(2^32 / bound) preimages).
    Larger bounds: the low bits of a few random bytes, redrawn where >= bound.
    """
    if bound <= 2 ** 31:
        low_mask, threshold = 2 ** 32 - 1, 2 ** 32 % bound

        def draw(size: int) -> tuple[torch.Tensor, torch.Tensor]:
            drawn = _checked(bits.random_bytes(4 * size), 4 * size)
            product = (drawn.view(torch.int32).to(torch.int64) & low_mask) * bound  # 4 bytes read as one
            return product >> 32, (product & low_mask) >= threshold
    else:
        width = (bound - 1).bit_length()
        n_bytes, mask = (width + 7) // 8, (1 << width) - 1

        def draw(size: int) -> tuple[torch.Tensor, torch.Tensor]:
            drawn = _bytes(bits, size * n_bytes).view(size, n_bytes)
            value = drawn[:, 0].clone()
            for j in range(1, n_bytes):
                value |= drawn[:, j] << (8 * j)
            value &= mask
            return value, value < bound

    acceptance = 1.0 - (2 ** 32 % bound) / 2 ** 32 if bound <= 2 ** 31 else bound / 2 ** (bound - 1).bit_length()
    return _accepted(count, draw, acceptance)


def bernoulli_rational(bits: RandomBits, numerator: torch.Tensor, denominator: Union[int, torch.Tensor]
                       ) -> torch.Tensor:
    """Exact Bernoulli(numerator / denominator), elementwise, for 0 <= numerator <= denominator <= 2^55,
    numerator < 2^55.

    A uniform U in [0, 1) is compared with p = numerator / denominator one base-256 digit at a time
    (the digit recurrence r <- 256 r mod d in int64; a digit of 256 when p = 1 is above every
    byte); U < p is decided at the first digit where they differ, so a value costs 256/255 bytes on
    average and the result is exact.  The first digit decides all but 1/256 of the values at once;
    the ties go on alone.
    """
    scaled = numerator.to(torch.int64) * 256
    digit = scaled // denominator
    drawn = _bytes(bits, digit.numel())
    out = drawn < digit
    tied = _where(drawn == digit)
    if tied.numel():
        divisor = denominator if isinstance(denominator, int) else denominator[tied]
        remainder = scaled[tied] - digit[tied] * divisor
        while tied.numel():
            remainder *= 256
            digit = remainder // divisor
            remainder -= digit * divisor
            drawn = _bytes(bits, tied.numel())
            decided = drawn != digit
            out[tied[decided]] = drawn[decided] < digit[decided]
            tied, remainder = tied[~decided], remainder[~decided]
            if not isinstance(divisor, int):
                divisor = divisor[~decided]
    return out


def _bernoulli_exp_fraction(bits: RandomBits, numerator: torch.Tensor, denominator: Union[int, torch.Tensor]
                            ) -> torch.Tensor:
    """Exact Bernoulli(exp(-x)), x = numerator / denominator in [0, 1] (CKS Algorithm 1, first part):
    K = 1; while Bernoulli(x / K): K += 1; return K odd.  Bernoulli(x / K) is drawn as
    Bernoulli(x) and Bernoulli(1 / K), independent; K is the same for every value still going on."""
    going = bernoulli_rational(bits, numerator, denominator)
    out = ~going  # stopped at K = 1 (odd); the others are set when they stop at an odd K
    on = _where(going)
    k = 2
    while on.numel():
        den = denominator if isinstance(denominator, int) else denominator[on]
        going = bernoulli_rational(bits, numerator[on], den)
        second = _where(going)
        going[second] = bernoulli_rational(bits, torch.ones(second.numel(), dtype=torch.int64), k)
        if k % 2:
            out[on[~going]] = True
        on = on[going]
        k += 1
    return out


def _bernoulli_inverse_e(bits: RandomBits, count: int) -> torch.Tensor:
    """Exact Bernoulli(e^-1): CKS Algorithm 1 at x = 1, where Bernoulli(x / K) is Bernoulli(1 / K) and
    the first one (K = 1) always succeeds."""
    going = _fair_bits(bits, count)  # Bernoulli(1/2) at K = 2
    out = torch.zeros(count, dtype=torch.bool)  # stopped at K = 2 (even)
    on = _where(going)
    k = 3
    while on.numel():
        going = bernoulli_rational(bits, torch.ones(on.numel(), dtype=torch.int64), k)
        if k % 2:
            out[on[~going]] = True
        on = on[going]
        k += 1
    return out


def bernoulli_exp(bits: RandomBits, whole: torch.Tensor, numerator: torch.Tensor,
                  denominator: Union[int, torch.Tensor]) -> torch.Tensor:
    """Exact Bernoulli(exp(-(whole + numerator / denominator))), elementwise (CKS Algorithm 1):
    ``whole`` >= 0 independent Bernoulli(e^-1) must all succeed (stopping at the first failure),
    then Bernoulli(exp(-numerator / denominator)), 0 <= numerator < 2^55, numerator <= denominator <= 2^55."""
    out = _bernoulli_exp_fraction(bits, numerator, denominator)
    trying = _where(whole > 0)
    remaining = whole[trying]
    while trying.numel():
        alive = _bernoulli_inverse_e(bits, trying.numel())
        out[trying[~alive]] = False
        remaining = remaining[alive] - 1
        trying = trying[alive][remaining > 0]
        remaining = remaining[remaining > 0]
    return out


def _geometric_e(bits: RandomBits, count: int) -> torch.Tensor:
    """V with P(V = v) = (1 - e^-1) e^{-v}: the Bernoulli(e^-1) successes before the first failure."""
    success = _bernoulli_inverse_e(bits, count)
    out = success.to(torch.int64)
    on = _where(success)
    while on.numel():
        on = on[_bernoulli_inverse_e(bits, on.numel())]
        out[on] += 1
    if count and int(out.max()) > GEOMETRIC_LIMIT:
        raise SecureNoiseError(f"a geometric count exceeded {GEOMETRIC_LIMIT} (probability e^-{GEOMETRIC_LIMIT}): "
                               "the random-bit source is broken")
    return out


def geometric(bits: RandomBits, count: int, steps: int) -> torch.Tensor:
    """``count`` exact draws of X >= 0 with P(X = x) = (1 - e^{-1/t}) e^{-x/t}, t = ``steps``.

    CKS Algorithm 2's geometric part: X = U + t V with U on {0..t-1} drawn uniform and kept with
    probability e^{-U/t} (else redrawn), and V ~ Geometric(e^-1) independent of U; then
    P(X = u + t v) is proportional to e^{-u/t} e^{-v} = e^{-(u + t v)/t}.
    """
    def propose(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        u = _uniform_below(bits, size, steps)
        return u, _bernoulli_exp_fraction(bits, u, steps)

    return _accepted(count, propose, _ACCEPT_EXP) + steps * _geometric_e(bits, count)


def floored_laplace(bits: RandomBits, count: int, steps: int) -> torch.Tensor:
    """``count`` exact draws of floor(L), L ~ Lap(0, t) continuous (t = ``steps``).

    P(floor L = j) = (1 - p) p^j / 2 for j >= 0 and (1 - p) p^{-j-1} / 2 for j <= -1, p = e^{-1/t}:
    a fair sign and a geometric G (:func:`geometric`), j = G or -1 - G.
    """
    magnitude = geometric(bits, count, steps)
    negative = _fair_bits(bits, count)
    return torch.where(negative, -1 - magnitude, magnitude)


def discrete_laplace(bits: RandomBits, count: int, steps: int) -> torch.Tensor:
    """``count`` exact draws of the discrete Laplace law P(y) proportional to e^{-|y|/t} on Z
    (CKS Algorithm 2 with s = 1): a geometric magnitude and a fair sign, (negative, 0) redrawn."""
    def propose(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        magnitude = geometric(bits, size, steps)
        negative = _fair_bits(bits, size)
        return torch.where(negative, -magnitude, magnitude), ~(negative & (magnitude == 0))

    return _accepted(count, propose, 1.0 + math.expm1(-1.0 / steps) / 2)  # P(X = 0) = 1 - e^{-1/t}


def _divmod_square(u: torch.Tensor, divisor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(u^2 // divisor, u^2 % divisor) for u >= 0, exact: in int64 where u < SQUARE_LIMIT, in Python
    integers for the rare larger u (the quotient then capped at 2^62: reaching the cap would take
    2^62 successive Bernoulli(e^-1) successes)."""
    large = _where(u >= SQUARE_LIMIT)
    square = u.clone()
    square[large] = 0
    square *= square
    whole, rest = square // divisor, square % divisor
    for i in large.tolist():
        q, r = divmod(int(u[i]) ** 2, divisor)
        whole[i], rest[i] = min(q, 2 ** 62), r
    return whole, rest


def discrete_gaussian(bits: RandomBits, count: int, steps: int, width: int) -> torch.Tensor:
    """``count`` exact draws of the discrete Gaussian N_Z(0, sigma^2), sigma^2 = t w (t = ``steps``,
    w = ``width``, t w < 2^54).

    CKS Algorithm 3: Y discrete Laplace with scale t (:func:`discrete_laplace`), kept with
    probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) = exp(-(|Y| - w)^2 / (2 t w)), an exact
    Bernoulli of a rational exponent (:func:`bernoulli_exp`), else redrawn; the kept Y has P(y)
    proportional to exp(-y^2 / (2 sigma^2)).
    """
    divisor = 2 * steps * width

    def propose(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = discrete_laplace(bits, size, steps)
        whole, rest = _divmod_square((y.abs() - width).abs(), divisor)
        return y, bernoulli_exp(bits, whole, rest, divisor)

    return _accepted(count, propose, _ACCEPT_GAUSSIAN)


def _integer_noise(bits: RandomBits, count: int, plan: Plan) -> torch.Tensor:
    if isinstance(plan, DiscreteLaplacePlan):
        return floored_laplace(bits, count, plan.steps)
    return discrete_gaussian(bits, count, plan.steps, plan.width)


def _checked_sum(clipped_sum: torch.Tensor) -> torch.Tensor:
    """``clipped_sum`` flattened to float64 on the CPU, or a clear error."""
    if not isinstance(clipped_sum, torch.Tensor) or not clipped_sum.is_floating_point() or clipped_sum.is_complex():
        raise InvalidParameterError("clipped_sum must be a real floating-point tensor, got "
                                    f"{getattr(clipped_sum, 'dtype', type(clipped_sum).__name__)}")
    if clipped_sum.is_meta:
        raise InvalidParameterError("clipped_sum is on the meta device: it has no values to release")
    flat = clipped_sum.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
    if not bool(torch.isfinite(flat).all()):
        raise SecureNoiseError("the clipped sum has non-finite entries: it cannot be rounded onto the grid")
    return flat


def secure_noisy_sums(clipped_sums: Sequence[torch.Tensor], plan: Plan, bits: RandomBits) -> list[torch.Tensor]:
    """The released noisy sums grid * (round(clamp(S / grid)) + Z) of every tensor of
    ``clipped_sums`` (one per parameter), each shaped, typed and placed like its sum: what the
    optimizer sets as the gradients, INSTEAD of S + noise.

    ``plan`` (:func:`~dpnoise.accounting.secure_noise.plan_discrete_laplace` or
    :func:`~dpnoise.accounting.secure_noise.plan_discrete_gaussian`) is made once per run for the
    number n of noised coordinates of the whole model (the rounding bound covers all n).  The
    tensors are released in one call: the samplers' rejection rounds cost a fixed time per call.
    The work is done on the CPU in int64, CHUNK coordinates at a time; each release, an integer
    multiple of the grid, is converted to float64 (exact below 2^53 grid steps), cast and moved
    (post-processing).  The noise is independent across coordinates and calls.
    """
    if not isinstance(plan, (DiscreteLaplacePlan, DiscreteGaussianPlan)):
        raise InvalidParameterError(f"plan must be a DiscreteLaplacePlan or DiscreteGaussianPlan, got {plan!r}")
    flats = [_checked_sum(clipped_sum) for clipped_sum in clipped_sums]
    flat = torch.cat(flats) if flats else torch.zeros(0, dtype=torch.float64)
    grid = plan.rounding.grid
    released = torch.empty(flat.numel(), dtype=torch.float64)
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start:start + CHUNK]
        rounded = torch.round((part / grid).clamp_(-SUM_LIMIT, SUM_LIMIT)).to(torch.int64)
        released[start:start + CHUNK] = (rounded + _integer_noise(bits, part.numel(), plan)).to(torch.float64) * grid
    pieces = torch.split(released, [f.numel() for f in flats])
    # cast on the CPU, then move: a device without float64 (MPS) never sees the float64 release
    return [piece.view(s.shape).to(dtype=s.dtype).to(device=s.device) for piece, s in zip(pieces, clipped_sums)]


def secure_noisy_sum(clipped_sum: torch.Tensor, plan: Plan, bits: RandomBits) -> torch.Tensor:
    """:func:`secure_noisy_sums` of one tensor."""
    return secure_noisy_sums([clipped_sum], plan, bits)[0]


def _whole_noise_only(shares: int) -> None:
    if check_count("shares", shares, 1) != 1:
        raise InvalidParameterError(
            f"shares must be 1 for the secure samplers, got {shares!r}: a sum of grid-rounded shares is "
            "not the released law; all-reduce the clipped sums first and release their total on one rank")


def secure_laplace_sum(clipped_sum: torch.Tensor, scale: float, clip: float, bits: RandomBits, shares: int = 1,
                       *, coordinates: int, norm_ord: int = 2, grid: Optional[float] = None) -> torch.Tensor:
    """:func:`secure_noisy_sum` with the Laplace plan for absolute scale b = ``scale`` (lap2:
    ``norm_ord=2``; laplace-l1: ``norm_ord=1``) over ``coordinates`` noised coordinates."""
    _whole_noise_only(shares)
    return secure_noisy_sum(clipped_sum, plan_discrete_laplace(scale, clip, coordinates, norm_ord, grid), bits)


def secure_gaussian_sum(clipped_sum: torch.Tensor, noise_multiplier: float, clip: float, bits: RandomBits,
                        shares: int = 1, *, coordinates: int, grid: Optional[float] = None) -> torch.Tensor:
    """:func:`secure_noisy_sum` with the discrete Gaussian plan for ``noise_multiplier`` (L2 clip)."""
    _whole_noise_only(shares)
    return secure_noisy_sum(clipped_sum, plan_discrete_gaussian(noise_multiplier, clip, coordinates, grid), bits)
