"""The one timing helper of the benchmarks: interleaved rounds, medians and paired ratios.

On a shared machine the speed drifts while a benchmark runs (other processes come and go), so
candidates timed one after the other are not compared under the same conditions.  Here every
round runs every candidate, each time in a freshly shuffled order, so that a slow phase hits all
candidates alike; a candidate's figure is the median over rounds, and a comparison of two
candidates is the median over rounds of their ratio within the round (a paired ratio), which
cancels what a round's conditions did to both.

    from timing import interleaved, same

    timings = interleaved({"ours": same(ours), "theirs": same(theirs)}, rounds=7)
    timings.median("ours")           # seconds per call, median over rounds
    timings.ratio("ours", "theirs")  # median over rounds of ours / theirs in the same round

A benchmark whose configurations each run in a process of their own (bench_finetune.py,
bench_efficientnet.py: a process's peak memory is then its configuration's) builds its candidates
with :func:`own_processes` and prints them with :func:`print_process_table`.

Benchmarks are run as scripts (``python benchmarks/bench_x.py``), so this module is imported as
``timing`` from the benchmarks folder.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

#: one timed call
Call = Callable[[], object]
#: a candidate: given the index i of its call (0, 1, ... over all rounds; warm-up calls get i < 0),
#: the call to time; building it is not timed, so every call can get fresh inputs
Candidate = Callable[[int], Call]


@dataclass(frozen=True)
class Measured:
    """What a call returns when it times itself (e.g. steps timed inside a child process, without the
    process's start-up): its seconds are the figure, its value is kept as the call's value."""

    seconds: float
    value: object = None


def same(call: Call) -> Candidate:
    """A candidate that times the same ``call`` every time."""
    return lambda i: call


@dataclass(frozen=True)
class Timings:
    """Seconds per call of every candidate, one figure per round, and each candidate's last value."""

    seconds: dict[str, list[float]]
    values: dict[str, object]

    @property
    def rounds(self) -> int:
        return len(next(iter(self.seconds.values()), []))

    def median(self, name: str) -> float:
        """Median over rounds of ``name``'s seconds per call."""
        return statistics.median(self.seconds[name])

    def ratio(self, numerator: str, denominator: str) -> float:
        """Paired ratio: median over rounds of ``numerator``'s time / ``denominator``'s in the same round."""
        pairs = zip(self.seconds[numerator], self.seconds[denominator], strict=True)
        return statistics.median(a / b for a, b in pairs)


def interleaved(
    candidates: Mapping[str, Candidate],
    rounds: int,
    *,
    calls: int = 1,
    warmup: int = 0,
    before: Callable[[], object] | None = None,
    seed: int = 0,
) -> Timings:
    """Time every candidate over ``rounds`` interleaved rounds.

    A round is ``calls`` passes; each pass calls every candidate once, in a freshly shuffled order,
    and a round's figure for a candidate is its mean seconds per call over the round's passes.
    ``warmup`` untimed passes run first (first-call costs: imports, constant tables, allocator).
    ``before`` runs, untimed, before every call (e.g. to clear caches so that nothing computed for
    an earlier call is reused).  A call that returns :class:`Measured` is timed by its own figure.
    """
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds and calls must be positive, got {rounds} and {calls}")
    rng = random.Random(seed)
    order = list(candidates)
    values: dict[str, object] = {}

    def run_pass(i: int) -> dict[str, float]:
        rng.shuffle(order)
        taken = {}
        for name in order:
            call = candidates[name](i)
            if before is not None:
                before()
            started = time.perf_counter()
            value = call()
            taken[name] = time.perf_counter() - started
            if isinstance(value, Measured):
                taken[name], value = value.seconds, value.value
            values[name] = value
        return taken

    for i in range(-warmup, 0):
        run_pass(i)
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(rounds):
        totals = dict.fromkeys(candidates, 0.0)
        for j in range(calls):
            for name, taken in run_pass(r * calls + j).items():
                totals[name] += taken
        for name, total in totals.items():
            seconds[name].append(total / calls)
    return Timings(seconds, values)


# ------------------------------------------------------------------ one process per configuration
# A benchmark whose configurations each need a fresh process (so that a process's peak memory is its
# own configuration's) runs itself as a child: ``script --measure NAME ...`` calls ``timed_steps``
# and prints its dict as the last line of JSON; the parent times those children interleaved.


def add_process_options(parser: argparse.ArgumentParser, configurations: Sequence[str], quick: str) -> None:
    """The options every one-process-per-configuration benchmark takes: which configurations, rounds,
    timed and warm-up steps per process, ``--quick`` (described by ``quick``), and the hidden
    ``--measure NAME`` that makes the script a child measuring one configuration."""
    parser.add_argument("--configurations", nargs="+", choices=configurations, default=list(configurations),
                        help="configurations to time (default: all); non-private, the ratios' baseline, always runs")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (one process per configuration each)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per process first")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--measure", choices=configurations, help=argparse.SUPPRESS)


def timed_steps(step: Callable[[object], object], batches: Sequence[object], warmup: int) -> dict[str, float]:
    """Run ``step`` on the first ``warmup`` batches untimed, then on the rest timed: seconds per timed
    step, and the process's resident memory before the first step and at its peak (MB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for batch in batches[:warmup]:
        step(batch)
    started = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    return {"seconds": (time.perf_counter() - started) / (len(batches) - warmup),
            "rss_before_mb": before / 1024, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def reset_peak_memory() -> None:
    """Make the process's peak resident set its current one (Linux: ``/proc/self/clear_refs``), so that the
    peak :func:`timed_steps` reports is that of the steps, not of what ran before them (e.g. a float64 check)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def in_own_process(script: str, arguments: Sequence[str]) -> Measured:
    """``script`` run with ``arguments`` in a fresh Python process, timed by the JSON dict (with
    ``seconds``) of its last line of output; a failure is returned as its last line of error."""
    finished = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True)
    if finished.returncode != 0:
        error = (finished.stderr.strip().splitlines() or [f"exit status {finished.returncode}"])[-1]
        return Measured(float("nan"), {"error": error if finished.returncode > 0 else f"killed by signal "
                                                                                      f"{-finished.returncode}"})
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    return Measured(result["seconds"], result)


def own_processes(script: str, names: Iterable[str], arguments: Callable[[str], list[str]]) -> dict[str, Candidate]:
    """A candidate per configuration name: ``script`` run with ``arguments(name)`` in its own process."""
    return {name: same(functools.partial(in_own_process, script, arguments(name))) for name in names}


def print_process_table(configurations: Sequence[str], timings: Timings, baseline: str = "non-private") -> None:
    """One row per configuration: seconds per step, peak memory (the JSON dicts of ``timed_steps``), each
    beside its ratio to ``baseline``'s (time: paired by round); a failed configuration with its error."""
    base = timings.values[baseline]
    print(f"{'configuration':<15}{'s/step':>9}{'x ' + baseline:>15}{'peak memory':>13}{'x ' + baseline:>15}")
    for name in configurations:
        value = timings.values[name]
        if "error" in value:
            print(f"{name:<15}  failed: {value['error'][:100]}")
            continue
        memory_ratio = value["peak_rss_mb"] / base["peak_rss_mb"] if "peak_rss_mb" in base else float("nan")
        print(f"{name:<15}{timings.median(name):>9.2f}{timings.ratio(name, baseline):>14.2f}x"
              f"{value['peak_rss_mb'] / 1024:>11.2f} GB{memory_ratio:>14.2f}x")


def fed_by_hand(optimizer):
    """``optimizer`` (a dpnoise private optimizer) stepping on batches the benchmark chooses, the same batches for
    every candidate and round: each is taken as one whole Poisson batch.  In training the engine's step provenance
    refuses a batch that its private loader did not draw (rightly: it would be accounted as a draw it is not);
    a timing run releases nothing."""
    from dpnoise.training.sampling import LogicalBatchTracker

    optimizer.logical_batches = LogicalBatchTracker()
    return optimizer
