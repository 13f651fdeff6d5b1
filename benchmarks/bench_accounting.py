"""Accounting speed against its targets, every figure measured in ONE run (issue 12, part C).

Prints one line per figure -- name, measured, target, PASS/MISS:
  * each RDP accountant (lap2-rdp, gaussian-rdp, laplace-l1-rdp, lap2-paper, dirichlet,
    penultimate-gaussian-rdp): one fresh epsilon query (median)               target < 10 ms
  * each RDP calibration (lap2-rdp, gaussian-rdp, laplace-l1-rdp)             target < 100 ms
  * each PLD-based accountant (gaussian, gaussian-pld, laplace-l1, lap2, lap2-gdp,
    penultimate-gaussian): one fresh epsilon query (median)                   target < 300 ms
    and its calibration                                                       target < 3 s
  * the whole process `dpnoise account ...` and `dpnoise calibrate ...` (median of 3)
                                                                              target < 1 s
  * for reference, in the same run: `python -c "import dp_accounting"` and
    `python -c "import scipy.special, scipy.optimize"` (the floor under the CLI figures)

Setting: the seed's MNIST run (q = 0.0043, T = 5860, delta = 1e-5, n = 26010 parameters for lap2),
noise 0.8 (sigma, or b/C for the Laplace mechanisms; 1.6 for penultimate-gaussian, whose event
is sigma/2; r = 0.25 for dirichlet); calibrations to epsilon = 3.42.

"Fresh": before every query or calibration the result caches are cleared (the RDP curve cache,
the majorization rules, every PLD cache), and each query also gets a new noise and sample rate
(perturbed by < 1%), so nothing computed for an earlier input is reused.  Process-wide constant
tables that depend on no input (Gauss-Legendre nodes, log-factorials, series coefficients) stay
warm after the first query; the CLI figures include them, and every import.  dp_accounting is
imported before any timing, so its import (seconds here) is not counted in the in-process
figures.  Rounds are interleaved (every accountant once per round, in a fresh shuffled order) so
that a slow phase of a shared machine hits all of them alike; medians are reported.

    .venv/bin/python benchmarks/bench_accounting.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import dp_accounting  # noqa: F401  (imported once, before any timing)

from dpnoise.accounting import UnsoundAccountantWarning, calibrate_noise, get_accountant
from dpnoise.accounting.pld import distribution as pld_distribution
from dpnoise.accounting.rdp import registry as rdp_registry
from dpnoise.accounting.rdp.majorization import majorization_rule

try:  # the calibrators' root finder (an implementation detail: its absence only drops an info line)
    from dpnoise.accounting.calibration import solve_smallest
except ImportError:  # pragma: no cover
    solve_smallest = None

Q, STEPS, DELTA, PARAMS, TARGET_EPSILON = 0.0043, 5860, 1e-5, 26010, 3.42

#: accountant -> (noise in its mechanism's unit, extra step() arguments)
RDP_ACCOUNTANTS: dict[str, tuple[float, dict]] = {
    "lap2-rdp": (0.8, {"params": PARAMS}),
    "gaussian-rdp": (0.8, {}),
    "laplace-l1-rdp": (0.8, {}),
    "lap2-paper": (0.8, {"params": PARAMS}),
    "dirichlet": (0.25, {}),
    "penultimate-gaussian-rdp": (1.6, {}),
}
RDP_CALIBRATIONS = ["lap2-rdp", "gaussian-rdp", "laplace-l1-rdp"]
PLD_ACCOUNTANTS: dict[str, tuple[float, dict]] = {
    "gaussian": (0.8, {}),
    "gaussian-pld": (0.8, {}),
    "laplace-l1": (0.8, {}),
    "lap2": (0.8, {"params": PARAMS}),
    "lap2-gdp": (0.8, {"params": PARAMS}),
    "penultimate-gaussian": (1.6, {}),
}
CLI_COMMANDS = {
    "dpnoise account (gaussian)": ["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.01",
                                   "--steps", "100", "--delta", "1e-5"],
    "dpnoise calibrate (lap2)": ["calibrate", "--mechanism", "lap2", "--epsilon", "1", "--sample-rate", "0.0043",
                                 "--steps", "5860", "--delta", "1e-5", "--params", "26010"],
}
IMPORT_REFERENCES = {
    "python -c 'import dp_accounting'": "import dp_accounting",
    "python -c 'import scipy.special, scipy.optimize'": "import scipy.special, scipy.optimize",
}


def clear_caches() -> None:
    """Forget every computed result: RDP curves, majorization rules and every PLD cache."""
    rdp_registry._mechanism_rdp.cache_clear()
    majorization_rule.cache_clear()
    for value in vars(pld_distribution).values():
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == pld_distribution.__name__:
            value.cache_clear()


def seconds(fn: Callable[[], object]) -> float:
    clear_caches()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(jobs: dict[str, Callable[[int], Callable[[], object]]], rounds: int) -> dict[str, float]:
    """Median seconds of every job over ``rounds`` rounds, each round in a fresh shuffled order.

    ``jobs[name](k)`` builds round k's call (so that every round can get fresh inputs).
    """
    samples: dict[str, list[float]] = {name: [] for name in jobs}
    order = list(jobs)
    for k in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name].append(seconds(jobs[name](k)))
    return {name: statistics.median(values) for name, values in samples.items()}


def fresh_query(name: str, noise: float, extra: dict, seed: int) -> Callable[[], float]:
    """One epsilon query on an input no earlier query used (noise and q perturbed by < 1%)."""
    rng = random.Random(f"{name}/{seed}")
    noise_k = noise * (1 + 0.01 * rng.random())
    q_k = Q * (1 + 0.01 * rng.random())

    def query() -> float:
        return get_accountant(name).step(noise_k, q_k, steps=STEPS, **extra).get_epsilon(DELTA)

    return query


def calibration(name: str, compare: bool = False) -> Callable[[int], Callable[[], object]]:
    params = PARAMS if name.startswith("lap2") else None
    return lambda k: (lambda: calibrate_noise(name, TARGET_EPSILON, DELTA, Q, STEPS, params=params, compare=compare))


def root_finding(name: str) -> Callable[[int], Callable[[], object]]:
    """The search a calibration makes, without the side-by-side epsilons of other accountants."""
    noise, extra = RDP_ACCOUNTANTS[name]

    def epsilon_of(x: float) -> float:
        return get_accountant(name).step(x, Q, steps=STEPS, **extra).get_epsilon(DELTA)

    return lambda k: (lambda: solve_smallest(epsilon_of, TARGET_EPSILON, initial=noise))


def dpnoise_command() -> list[str]:
    script = Path(sys.executable).with_name("dpnoise")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dpnoise"]


def subprocess_seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def report(name: str, measured_s: float, target_s: float) -> bool:
    unit, scale = ("ms", 1e3) if target_s < 1.0 else ("s", 1.0)
    verdict = "PASS" if measured_s < target_s else "MISS"
    print(f"  {name:<52}{measured_s * scale:>9.1f} {unit:<3} target < {target_s * scale:g} {unit:<3} {verdict}")
    return measured_s < target_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (3 / 1 / 1 / 3 instead of 9 / 3 / 3 / 3)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of fresh RDP queries (default 9, --quick 3)")
    args = parser.parse_args()
    rdp_rounds = args.rounds or (3 if args.quick else 9)
    heavy_rounds = 1 if args.quick else 3  # calibrations and PLD queries
    cli_rounds = 3
    warnings.simplefilter("ignore", UnsoundAccountantWarning)
    random.seed(0)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"accounting speed, {os.cpu_count()} CPUs, load average {load:.2f} at start; q={Q}, T={STEPS}, "
          f"delta={DELTA:g}, lap2 n={PARAMS}; dp_accounting imported before timing (not counted in-process)")
    results: list[bool] = []

    # warm-up: one query of each kind (first-call costs of the process, e.g. constant tables)
    for name, (noise, extra) in {**RDP_ACCOUNTANTS, **PLD_ACCOUNTANTS}.items():
        seconds(fresh_query(name, noise, extra, -1))

    rdp = interleaved({name: (lambda k, n=name, a=spec: fresh_query(n, a[0], a[1], k))
                       for name, spec in RDP_ACCOUNTANTS.items()}, rdp_rounds)
    print(f"RDP accountants, fresh epsilon query (median of {rdp_rounds}, caches cleared, new inputs each time):")
    for name in RDP_ACCOUNTANTS:
        results.append(report(f"{name} query", rdp[name], 0.010))

    cal = interleaved({name: calibration(name) for name in RDP_CALIBRATIONS}, heavy_rounds)
    print(f"RDP calibrations, calibrate_noise(name, {TARGET_EPSILON}, ..., compare=False) (median of {heavy_rounds}, "
          "caches cleared):")
    for name in RDP_CALIBRATIONS:
        results.append(report(f"{name} calibration", cal[name], 0.100))
    compared = interleaved({name: calibration(name, compare=True) for name in RDP_CALIBRATIONS}, heavy_rounds)
    print("  with compare=True (also the epsilon under the mechanism's other accountants, PLD routes among them):")
    for name in RDP_CALIBRATIONS:
        print(f"  {name + ' calibration + side by side':<52}{compared[name] * 1e3:>9.1f} ms")
    if solve_smallest is not None:
        roots = interleaved({name: root_finding(name) for name in RDP_CALIBRATIONS}, heavy_rounds)
        print("  of which the root finding alone (solve_smallest on the accountant's own epsilon, no other routes):")
        for name in RDP_CALIBRATIONS:
            print(f"  {name + ' root finding':<52}{roots[name] * 1e3:>9.1f} ms")

    pld = interleaved({name: (lambda k, n=name, a=spec: fresh_query(n, a[0], a[1], k))
                       for name, spec in PLD_ACCOUNTANTS.items()}, heavy_rounds)
    pld_cal = interleaved({name: calibration(name) for name in PLD_ACCOUNTANTS}, heavy_rounds)
    print(f"PLD-based accountants (median of {heavy_rounds}, caches cleared):")
    for name in PLD_ACCOUNTANTS:
        results.append(report(f"{name} query", pld[name], 0.300))
    for name in PLD_ACCOUNTANTS:
        results.append(report(f"{name} calibration", pld_cal[name], 3.0))

    commands = {label: dpnoise_command() + argv for label, argv in CLI_COMMANDS.items()}
    commands.update({label: [sys.executable, "-c", code] for label, code in IMPORT_REFERENCES.items()})
    samples: dict[str, list[float]] = {label: [] for label in commands}
    order = list(commands)
    for _ in range(cli_rounds):
        random.shuffle(order)
        for label in order:
            samples[label].append(subprocess_seconds(commands[label]))
    print(f"Whole process, subprocess wall time (median of {cli_rounds}):")
    for label in CLI_COMMANDS:
        results.append(report(label, statistics.median(samples[label]), 1.0))
    print("  for reference (no target):")
    for label in IMPORT_REFERENCES:
        print(f"  {label:<52}{statistics.median(samples[label]):>9.2f} s")
    print(f"{sum(results)} of {len(results)} figures within target")


if __name__ == "__main__":
    main()
