"""Cost of the floating-point-safe samplers (secure mode) against the float samplers, one thread.

For each size n (26,010: the tutorial CNN; 22.7M: MiniLM fine-tuning) and each noise family, times
the release of a noisy sum of n float32 coordinates: plain = ``S + laplace_noise(S, ...)`` /
``S + gaussian_noise(S, ...)`` (torch's Mersenne Twister, float64 draws); secure =
``secure_noisy_sum(S, plan, SystemRandomBits())`` (exact integer noise on the grid, bytes from
os.urandom), and prints the seconds side by side with their paired ratio (benchmarks/timing.py).
Also prints the random-bit sources' throughput and the bytes each secure coordinate consumed.
Settings: lap2 with b = 1, C = 1 (the plan for n coordinates); Gaussian with sigma = 1, C = 1.

    .venv/bin/python benchmarks/bench_secure_noise.py              # both sizes, 3 rounds
    .venv/bin/python benchmarks/bench_secure_noise.py --quick      # 26,010 only, 3 rounds
    .venv/bin/python benchmarks/bench_secure_noise.py --rounds 5 --sizes 26010 1000000
"""

import argparse
import os
import time

import torch
from timing import interleaved, same

from dpnoise.accounting.secure_noise import plan_discrete_gaussian, plan_discrete_laplace
from dpnoise.mechanisms.noise import gaussian_noise, laplace_noise
from dpnoise.mechanisms.secure_noise import Shake256RandomBits, SystemRandomBits, secure_noisy_sum

SIZES = [26_010, 22_700_000]


class CountingBits:
    """A random-bit source that counts the bytes it hands out."""

    def __init__(self, source):
        self.source, self.count = source, 0

    def random_bytes(self, count: int) -> torch.Tensor:
        self.count += count
        return self.source.random_bytes(count)


def source_throughput(source, total: int = 1 << 26) -> float:
    """Bytes per second of ``source`` in 4 MiB requests."""
    started = time.perf_counter()
    for _ in range(total >> 22):
        source.random_bytes(1 << 22)
    return total / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", help="coordinates (default: 26010 and 22700000)")
    parser.add_argument("--quick", action="store_true", help="26,010 coordinates only")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = args.sizes or (SIZES[:1] if args.quick else SIZES)
    system = SystemRandomBits()
    rates = {"os.urandom": source_throughput(system),
             "SHAKE-256": source_throughput(Shake256RandomBits(os.urandom(32)))}
    print("random-bit source throughput (MB/s): " + ", ".join(f"{k} {v / 1e6:.0f}" for k, v in rates.items()))
    print("| n | noise | plain s | secure s | secure / plain | bytes per coordinate | secure coordinates/s |")
    print("|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for n in sizes:
        clipped_sum = torch.randn(n, generator=generator) * 1e-3
        plans = {"laplace (lap2)": (plan_discrete_laplace(1.0, 1.0, n, 2), laplace_noise),
                 "gaussian": (plan_discrete_gaussian(1.0, 1.0, n), gaussian_noise)}
        for name, (plan, sampler) in plans.items():
            counter = CountingBits(system)
            secure_noisy_sum(clipped_sum, plan, counter)
            timings = interleaved({
                "plain": same(lambda: clipped_sum + sampler(clipped_sum, 1.0, 1.0, generator)),
                "secure": same(lambda: secure_noisy_sum(clipped_sum, plan, system)),
            }, rounds=args.rounds, warmup=1 if n < 10 ** 6 else 0)
            secure = timings.median("secure")
            print(f"| {n:,} | {name} | {timings.median('plain'):.4g} | {secure:.4g} | "
                  f"{timings.ratio('secure', 'plain'):.1f} | {counter.count / n:.1f} | {n / secure:.3g} |")


if __name__ == "__main__":
    main()
