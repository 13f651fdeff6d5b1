"""Spec lap2 §3 table: exact PLD lower bound vs the Lap2 accountants in the seed's MNIST setting.

Usage: .venv/bin/python benchmarks/bench_audit.py [b ...]   (default: the five b of the table)
"""

import sys
import time
import warnings

from dpnoise.accounting import UnsoundAccountantWarning, get_accountant
from dpnoise.audit.pld import lower_bound

Q, T, C, N, DELTA = 0.0043, 5860, 1.0, 26010, 1e-5


def claim(name: str, b: float) -> float:
    acc = get_accountant(name).step(b, Q, clip=C, params=N, steps=T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return acc.get_epsilon(DELTA)


def main() -> None:
    bs = [float(b) for b in sys.argv[1:]] or [0.4, 0.8, 1.296, 2.46, 4.70]
    print("| b | lap2-paper | exact lower bound (worst k, direction) | lap2 (sound) | seconds |")
    print("|---|---|---|---|---|")
    for b in bs:
        start = time.time()
        res = lower_bound("lap2", b, Q, T, DELTA, clip=C, params=N)
        print(f"| {b} | {claim('lap2-paper', b):.3f} | {res.epsilon:.3f} (k = {res.k}, {res.direction}) "
              f"| {claim('lap2', b):.3f} | {time.time() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
