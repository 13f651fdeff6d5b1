"""Small log-space helpers."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import gammaln


def log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) for x >= 0, accurate for tiny and huge x (-inf at x = 0)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        small = np.log(np.expm1(np.minimum(x, 50.0)))
        large = x + np.log1p(-np.exp(-np.maximum(x, 50.0)))
    return np.where(x < 50.0, small, large)


#: Orders per block in :func:`log_binomial_mixture`.
_ROW_BLOCK = 64
#: Terms below e^-60 of their sum's largest term are skipped (far below rounding: 257 e^-60 < 1e-23).
_NEGLIGIBLE = 60.0


@lru_cache(maxsize=4)
def _log_factorials(n: int) -> np.ndarray:
    """log m! for m = 0..n (read-only)."""
    out = gammaln(np.arange(n + 1, dtype=float) + 1.0)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=16)
def _minus_log_factorial_of_difference(orders: bytes, max_order: int) -> np.ndarray:
    """M[a, eta] = -log (a - eta)! for eta <= a, -inf for eta > a (rows: the integer ``orders``)."""
    a = np.frombuffer(orders, dtype=np.int64)
    diff = a[:, None] - np.arange(max_order + 1)[None, :]
    out = np.where(diff >= 0, -_log_factorials(max_order)[np.maximum(diff, 0)], -np.inf)
    out.setflags(write=False)
    return out


def _integer_orders(orders: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(orders, dtype=float).round().astype(np.int64).ravel())


def log_binomial_weights(q: float, orders: np.ndarray) -> np.ndarray:
    """log w[a, eta] = log[C(a, eta) (1-q)^(a-eta) q^eta], eta = 0..max(a); -inf for eta > a.

    The Binomial(a, q) weights of the subsampled moment expansions (Mironov et al. 2019, Eq. (3);
    Lap2 paper, Thm III.2).  ``orders`` must be integers.
    """
    a_int = _integer_orders(orders)
    max_order = int(a_int.max())
    log_fact = _log_factorials(max_order)
    table = _minus_log_factorial_of_difference(a_int.tobytes(), max_order)  # -inf for eta > a
    eta = np.arange(max_order + 1)
    if q <= 0.0 or q >= 1.0:  # all mass on eta = 0 (q = 0) or on eta = a (q = 1)
        point = np.zeros_like(a_int) if q <= 0.0 else a_int
        return np.where(eta[None, :] == point[:, None], 0.0, -np.inf)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    row = log_fact[a_int] + a_int * log_1mq
    column = eta * (log_q - log_1mq) - log_fact
    return table + row[:, None] + column[None, :]


def matmul_blocked(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """left @ right, in row blocks small enough (m n k < 2^18) for a single-threaded BLAS call.

    A multi-threaded BLAS call waits for all its threads; on a machine whose cores are busy with
    other processes a ~1e7-flop product then takes a scheduler time slice (~24 ms) instead of
    ~0.5 ms.  Row blocks keep each call below OpenBLAS's threading threshold.
    """
    rows = max(1, (1 << 18) // max(1, left.shape[1] * right.shape[1]))
    if left.shape[0] <= rows:
        return left @ right
    return np.concatenate([left[i : i + rows] @ right for i in range(0, left.shape[0], rows)], axis=0)


def log_binomial_mixture(q: float, orders: np.ndarray, log_terms: np.ndarray, first: int = 2) -> np.ndarray:
    """log sum_{eta = first}^{a} C(a, eta) (1-q)^(a-eta) q^eta exp(log_terms[eta]) at each integer order a.

    -inf where the sum is empty or all its terms are zero, +inf where a term is +inf.  Requires
    0 < q < 1 and ``len(log_terms) > max(orders)``.  The binomial weight splits as
    [log a! + a log(1-q)] + [eta log(q/(1-q)) - log eta!] - log (a-eta)!, so the (order, eta) matrix
    is one cached q-independent table plus two vectors, summed in log space row by row (in blocks
    of orders, each only up to its largest order's eta).
    """
    a_int = _integer_orders(orders)
    if np.any(a_int[1:] < a_int[:-1]):  # work on sorted orders, answer in the caller's order
        by_order = np.argsort(a_int, kind="stable")
        out = np.empty(a_int.size)
        out[by_order] = log_binomial_mixture(q, a_int[by_order], log_terms, first)
        return out
    max_order = int(a_int.max())
    log_fact = _log_factorials(max_order)
    log_terms = np.asarray(log_terms, dtype=float)[: max_order + 1]
    eta = np.arange(max_order + 1, dtype=float)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    with np.errstate(invalid="ignore"):
        column = eta * (log_q - log_1mq) - log_fact + log_terms
    column[:first] = -np.inf
    # A +inf term makes every order that contains it +inf; keep the matrix finite-or--inf.
    infinite = np.isposinf(column)
    first_infinite = int(np.argmax(infinite)) if infinite.any() else max_order + 1
    column = np.where(infinite, 0.0, column)
    table = _minus_log_factorial_of_difference(a_int.tobytes(), max_order)
    peak = np.full(a_int.size, -np.inf)
    total = np.zeros(a_int.size)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # Row a's largest term is at least its eta = a term, column[a]; terms with
        # column[eta] < column[a] - _NEGLIGIBLE are below e^-60 of it (table <= 0) and are skipped.
        reach = np.maximum.accumulate(column)
        for start in range(0, a_int.size, _ROW_BLOCK):
            rows = slice(start, start + _ROW_BLOCK)
            top = int(a_int[rows][-1]) + 1
            if top <= first:
                continue
            floor = column[np.maximum(a_int[rows], first)].min()
            low = first
            if np.isfinite(floor):
                low = int(min(max(first, np.searchsorted(reach, floor - _NEGLIGIBLE, side="left")), top - 1))
            summands = table[rows, low:top] + column[None, low:top]
            block_peak = summands.max(axis=1)
            finite_peak = np.where(np.isfinite(block_peak), block_peak, 0.0)
            summands -= finite_peak[:, None]
            total[rows] = np.exp(summands, out=summands).sum(axis=1)
            peak[rows] = block_peak
        finite_peak = np.where(np.isfinite(peak), peak, 0.0)
        out = np.log(total) + finite_peak + (log_fact[a_int] + a_int * log_1mq)
    out = np.where(np.isfinite(peak), out, peak)
    return np.where(a_int >= first_infinite, np.inf, out)
