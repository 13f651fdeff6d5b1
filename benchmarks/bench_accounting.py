"""Accounting speed against its targets, every figure measured in ONE run.

Prints one line per figure -- name, measured, target, PASS/MISS:
  * each RDP accountant (lap2-rdp, gaussian-rdp, laplace-l1-rdp, lap2-paper, dirichlet,
    penultimate-gaussian): one fresh epsilon query (median)                   target < 10 ms
  * each RDP calibration (lap2-rdp, gaussian-rdp, laplace-l1-rdp)             target < 100 ms
  * each PLD-based accountant (gaussian, gaussian-pld, laplace-l1, lap2, lap2-gdp): one fresh
    epsilon query (median)                                                    target < 300 ms
    and its calibration                                                       target < 3 s

The whole process (`dpnoise account ...`, `dpnoise calibrate ...`, imports included) is timed by
bench_cli.py.

Setting: the seed's MNIST run (q = 0.0043, T = 5860, delta = 1e-5, n = 26010 parameters for lap2),
C = 1, noise 0.8 (noise_multiplier sigma, or laplace_scale b for the Laplace mechanisms; sigma = 1.6
for penultimate-gaussian, whose event is sigma/2; concentration r = 0.25 for dirichlet);
calibrations to epsilon = 3.42.

"Fresh": before every query or calibration the result caches are cleared (the RDP curve cache,
the majorization rules, every PLD cache), and each query also gets a new noise and sample rate
(perturbed by < 1%), so nothing computed for an earlier input is reused.  Process-wide constant
tables that depend on no input (Gauss-Legendre nodes, log-factorials, series coefficients) stay
warm after the first query.  dp_accounting is imported before any timing, so its import is not
counted.  Rounds are interleaved (benchmarks/timing.py: every accountant once per round, in a fresh
shuffled order) so that a slow phase of a shared machine hits all of them alike; medians are reported.

    .venv/bin/python benchmarks/bench_accounting.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import random
import warnings

import dp_accounting  # noqa: F401  (imported once, before any timing)
from timing import Call, Candidate, interleaved, same

from dpnoise.accounting import (
    UnsoundAccountantWarning,
    calibrate_noise,
    get_accountant,
    noise_keywords,
)
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
    "penultimate-gaussian": (1.6, {}),
}
RDP_CALIBRATIONS = ["lap2-rdp", "gaussian-rdp", "laplace-l1-rdp"]
PLD_ACCOUNTANTS: dict[str, tuple[float, dict]] = {
    "gaussian": (0.8, {}),
    "gaussian-pld": (0.8, {}),
    "laplace-l1": (0.8, {}),
    "lap2": (0.8, {"params": PARAMS}),
    "lap2-gdp": (0.8, {"params": PARAMS}),
}


def clear_caches() -> None:
    """Forget every computed result: RDP curves, majorization rules and every PLD cache."""
    rdp_registry._mechanism_rdp.cache_clear()
    majorization_rule.cache_clear()
    for value in vars(pld_distribution).values():
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == pld_distribution.__name__:
            value.cache_clear()


def epsilon(name: str, noise: float, q: float, extra: dict) -> float:
    """``name``'s epsilon after STEPS steps; ``noise`` in its mechanism's unit (the keyword the registry gives)."""
    accountant = get_accountant(name)
    noise_keyword = noise_keywords(accountant.spec.mechanism, noise)
    return accountant.step(sample_rate=q, steps=STEPS, **noise_keyword, **extra).get_epsilon(DELTA)


def fresh_query(name: str) -> Candidate:
    """Epsilon queries, each on an input no earlier query used (noise and q perturbed by < 1%)."""
    noise, extra = {**RDP_ACCOUNTANTS, **PLD_ACCOUNTANTS}[name]

    def query(k: int) -> Call:
        rng = random.Random(f"{name}/{k}")
        noise_k = noise * (1 + 0.01 * rng.random())
        q_k = Q * (1 + 0.01 * rng.random())
        return lambda: epsilon(name, noise_k, q_k, extra)

    return query


def calibration(name: str, compare: bool = False) -> Candidate:
    params = PARAMS if name.startswith("lap2") else None
    return same(lambda: calibrate_noise(name, TARGET_EPSILON, DELTA, Q, STEPS, params=params, compare=compare))


def root_finding(name: str) -> Candidate:
    """The search a calibration makes, without the side-by-side epsilons of other accountants."""
    noise, extra = RDP_ACCOUNTANTS[name]

    return same(lambda: solve_smallest(lambda x: epsilon(name, x, Q, extra), TARGET_EPSILON, initial=noise))


def report(name: str, measured_s: float, target_s: float) -> bool:
    unit, scale = ("ms", 1e3) if target_s < 1.0 else ("s", 1.0)
    verdict = "PASS" if measured_s < target_s else "MISS"
    print(f"  {name:<52}{measured_s * scale:>9.1f} {unit:<3} target < {target_s * scale:g} {unit:<3} {verdict}")
    return measured_s < target_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (3 rounds of RDP queries and 1 of the rest, instead of 9 and 3)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of fresh RDP queries (default 9, --quick 3)")
    args = parser.parse_args()
    rdp_rounds = args.rounds or (3 if args.quick else 9)
    heavy_rounds = 1 if args.quick else 3  # calibrations and PLD queries
    warnings.simplefilter("ignore", UnsoundAccountantWarning)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"accounting speed, {os.cpu_count()} CPUs, load average {load:.2f} at start; q={Q}, T={STEPS}, "
          f"delta={DELTA:g}, lap2 n={PARAMS}; dp_accounting imported before timing (not counted in-process)")
    results: list[bool] = []

    # every in-process figure clears the caches before each call; query warm-up: one query of each
    # accountant (first-call costs of the process, e.g. constant tables)
    rdp = interleaved({name: fresh_query(name) for name in RDP_ACCOUNTANTS}, rdp_rounds, warmup=1, before=clear_caches)
    print(f"RDP accountants, fresh epsilon query (median of {rdp_rounds}, caches cleared, new inputs each time):")
    for name in RDP_ACCOUNTANTS:
        results.append(report(f"{name} query", rdp.median(name), 0.010))

    cal = interleaved({name: calibration(name) for name in RDP_CALIBRATIONS}, heavy_rounds, before=clear_caches)
    print(f"RDP calibrations, calibrate_noise(name, {TARGET_EPSILON}, ..., compare=False) (median of {heavy_rounds}, "
          "caches cleared):")
    for name in RDP_CALIBRATIONS:
        results.append(report(f"{name} calibration", cal.median(name), 0.100))
    compared = interleaved({name: calibration(name, compare=True) for name in RDP_CALIBRATIONS}, heavy_rounds,
                           before=clear_caches)
    print("  with compare=True (also the epsilon under the mechanism's other accountants, PLD routes among them):")
    for name in RDP_CALIBRATIONS:
        print(f"  {name + ' calibration + side by side':<52}{compared.median(name) * 1e3:>9.1f} ms")
    if solve_smallest is not None:
        roots = interleaved({name: root_finding(name) for name in RDP_CALIBRATIONS}, heavy_rounds, before=clear_caches)
        print("  of which the root finding alone (solve_smallest on the accountant's own epsilon, no other routes):")
        for name in RDP_CALIBRATIONS:
            print(f"  {name + ' root finding':<52}{roots.median(name) * 1e3:>9.1f} ms")

    pld = interleaved({name: fresh_query(name) for name in PLD_ACCOUNTANTS}, heavy_rounds, warmup=1, before=clear_caches)
    pld_cal = interleaved({name: calibration(name) for name in PLD_ACCOUNTANTS}, heavy_rounds, before=clear_caches)
    print(f"PLD-based accountants (median of {heavy_rounds}, caches cleared):")
    for name in PLD_ACCOUNTANTS:
        results.append(report(f"{name} query", pld.median(name), 0.300))
    for name in PLD_ACCOUNTANTS:
        results.append(report(f"{name} calibration", pld_cal.median(name), 3.0))
    print(f"{sum(results)} of {len(results)} figures within target")


if __name__ == "__main__":
    main()
