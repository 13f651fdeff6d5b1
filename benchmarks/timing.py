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

Benchmarks are run as scripts (``python benchmarks/bench_x.py``), so this module is imported as
``timing`` from the benchmarks folder.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
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
