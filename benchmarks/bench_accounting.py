"""Accounting speed, measured side by side in one run (not a test: the machines are shared/noisy).

Prints: our Gaussian accountant time vs Opacus's ``compute_rdp`` on the same orders (ratio), and
the time of a full lap2 / lap2-paper epsilon(delta) over all integer orders 2..256 for
n in {1e4, 1e6, 1e9}.  Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_accounting.py``.
"""

from __future__ import annotations

import statistics
import time
import warnings

from opacus.accountants.analysis.rdp import compute_rdp

from dpnoise.accounting import UnsoundAccountantWarning, get_accountant
from dpnoise.accounting.rdp import registry
from dpnoise.accounting.rdp.gaussian import sampled_gaussian_rdp
from dpnoise.accounting.rdp.majorization import majorization_rule
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS

REPEATS = 7


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_interleaved(fns: dict) -> dict:
    """Median seconds per function, alternating the functions in every round (fair under noise)."""
    samples = {name: [] for name in fns}
    for _ in range(REPEATS):
        for name, fn in fns.items():
            samples[name].append(timed(fn))
    return {name: statistics.median(v) for name, v in samples.items()}


def fresh_lap2(name: str, n: float) -> float:
    """Full epsilon(delta) of a lap2 run from scratch (caches cleared: nothing precomputed)."""
    registry._mechanism_rdp.cache_clear()
    majorization_rule.cache_clear()
    acc = get_accountant(name).step(0.8, 0.0043, clip=1.0, params=int(n), steps=5860)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return acc.get_epsilon(1e-5)


def main() -> None:
    orders = list(DEFAULT_ORDERS)
    grid = [(q, s) for q in (0.001, 0.01, 0.1) for s in (0.5, 1.0, 2.0)]
    times = median_interleaved(
        {
            "dpnoise": lambda: [sampled_gaussian_rdp(q, s, DEFAULT_ORDERS) for q, s in grid],
            "opacus": lambda: [compute_rdp(q=q, noise_multiplier=s, steps=1, orders=orders) for q, s in grid],
        }
    )
    print(f"Gaussian RDP, {len(grid)} (q, sigma) settings x {len(orders)} orders (median of {REPEATS}):")
    print(f"  dpnoise {times['dpnoise'] * 1e3:8.1f} ms   opacus {times['opacus'] * 1e3:8.1f} ms   "
          f"ratio dpnoise/opacus = {times['dpnoise'] / times['opacus']:.2f}")
    print("Lap2 full epsilon(delta) over integer orders 2..256 (q=0.0043, T=5860, b/C=0.8), cold caches:")
    for n in (1e4, 1e6, 1e9):
        t = median_interleaved({name: (lambda name=name: fresh_lap2(name, n)) for name in ("lap2", "lap2-paper")})
        print(f"  n = {n:8.0e}:  lap2 {t['lap2'] * 1e3:7.1f} ms   lap2-paper {t['lap2-paper'] * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
