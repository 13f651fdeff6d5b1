"""Spec lap2 §3 table: exact PLD lower bound vs the Lap2 accountants in the seed's MNIST setting.

For each noise b (Laplace scale relative to the clipping norm C = 1), prints the paper's Lap2
epsilon (lap2-paper), the exact PLD lower bound with its worst k and direction, the sound lap2
epsilon, and the seconds the lower bound took (median over rounds, benchmarks/timing.py).
MNIST setting q = 0.0043, T = 5860, n = 26010, delta = 1e-5.

    .venv/bin/python benchmarks/bench_audit.py [--quick] [--rounds N] [b ...]
    (default: the five b of the table; --quick: b = 2.46 and 4.7, the two fast rows)
"""

import argparse
import warnings

from timing import interleaved, same

from dpnoise.accounting import UnsoundAccountantWarning, get_accountant
from dpnoise.audit.pld import lower_bound

Q, T, C, N, DELTA = 0.0043, 5860, 1.0, 26010, 1e-5
TABLE_B = [0.4, 0.8, 1.296, 2.46, 4.70]
QUICK_B = [2.46, 4.70]


def claim(name: str, b: float) -> float:
    acc = get_accountant(name).step(sample_rate=Q, laplace_scale=b, clip=C, params=N, steps=T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        return acc.get_epsilon(DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("b", type=float, nargs="*", help="noise values (default: the table's five)")
    parser.add_argument("--quick", action="store_true", help=f"only b = {', '.join(map(str, QUICK_B))}")
    parser.add_argument("--rounds", type=int, default=1, help="lower-bound computations per b (default 1)")
    args = parser.parse_args()
    bs = args.b or (QUICK_B if args.quick else TABLE_B)
    print("| b | lap2-paper | exact lower bound (worst k, direction) | lap2 (sound) | seconds |")
    print("|---|---|---|---|---|")
    for b in bs:  # one row at a time, printed as soon as it is known (a row can take a minute)
        timings = interleaved({"bound": same(lambda b=b: lower_bound("lap2", b, Q, T, DELTA, clip=C, params=N))},
                              args.rounds)
        res = timings.values["bound"]
        print(f"| {b} | {claim('lap2-paper', b):.3f} | {res.epsilon:.3f} (k = {res.k}, {res.direction}) "
              f"| {claim('lap2', b):.3f} | {timings.median('bound'):.1f} |", flush=True)


if __name__ == "__main__":
    main()
