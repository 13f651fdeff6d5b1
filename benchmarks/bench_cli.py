"""Whole-process time of the accounting commands, ``dpnoise account`` and ``dpnoise calibrate``.

Each figure is the wall time of a fresh ``python -m dpnoise ...`` process as a subprocess sees it:
interpreter start-up, every import, the computation and the printing.  The same for
``python -c pass`` and ``python -c "import numpy"``, timed in the same rounds: on a shared machine
the absolute figures drift, so every command is also shown as a paired ratio to both (the median
over rounds of its time / the baseline's in the same round); ``import dp_accounting.pld`` is the
floor under every command that computes a PLD with dp_accounting (it loads scipy.stats).

Before timing, each command runs once: its first line of output and which of the heavy modules
(torch, scipy.stats, scipy.signal, scipy.optimize, dp_accounting) it imported are printed, and
that run writes the bytecode caches (into a temporary
``PYTHONPYCACHEPREFIX``, whatever ``PYTHONDONTWRITEBYTECODE`` says), as an installed package has
them.

    .venv/bin/python benchmarks/bench_cli.py            # 9 rounds
    .venv/bin/python benchmarks/bench_cli.py --quick    # 3 rounds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import Candidate, Timings, interleaved, same

#: Target of every dpnoise command (seconds per process, on a quiet machine).
TARGET_S = 0.5
SEED = ["--sample-rate", "0.0043", "--steps", "5860", "--delta", "1e-5"]
#: label -> dpnoise arguments: each mechanism's default accountant, the seed paper's MNIST setting
#: for lap2 and dirichlet, a common Gaussian setting
COMMANDS: dict[str, list[str]] = {
    "account gaussian": ["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.01",
                         "--steps", "1000", "--delta", "1e-5"],
    "account lap2": ["account", "--mechanism", "lap2", "--noise", "0.8", "--params", "26010", *SEED],
    "account dirichlet": ["account", "--mechanism", "dirichlet", "--noise", "0.25", *SEED],
    "calibrate gaussian": ["calibrate", "--mechanism", "gaussian", "--epsilon", "3", "--sample-rate", "0.01",
                           "--steps", "1000", "--delta", "1e-5"],
    "calibrate lap2": ["calibrate", "--mechanism", "lap2", "--epsilon", "3.42", "--params", "26010", *SEED],
    "calibrate dirichlet": ["calibrate", "--mechanism", "dirichlet", "--epsilon", "3.42", *SEED],
}
PASS = "python -c pass"
NUMPY = "python -c 'import numpy'"
#: label -> Python statement timed as a baseline
BASELINES: dict[str, str] = {
    PASS: "pass",
    NUMPY: "import numpy",
    "python -c 'import dp_accounting.pld'": "import dp_accounting.pld",
}
HEAVY_MODULES = ("torch", "scipy.stats", "scipy.signal", "scipy.optimize", "dp_accounting")
SRC = Path(__file__).resolve().parents[1] / "src"


def process_environment(pycache: str) -> dict[str, str]:
    """The environment of every timed process: bytecode cached under ``pycache``, this checkout's
    ``src`` first on the path (so an uninstalled checkout times its own code)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = pycache
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def argv_of(label: str) -> list[str]:
    """The full command line of a command or baseline label."""
    if label in COMMANDS:
        return [sys.executable, "-m", "dpnoise", *COMMANDS[label]]
    return [sys.executable, "-c", BASELINES[label]]


def timed_process(argv: list[str], env: dict[str, str]) -> Candidate:
    """A candidate running ``argv`` to completion (its output discarded; a failure raises)."""
    return same(lambda: subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL))


#: Runs ``python -m dpnoise`` with the arguments after ``-c``, and prints (to stderr, last) which
#: HEAVY_MODULES it imported.
PROBE = (
    "import atexit, runpy, sys\n"
    f"atexit.register(lambda: print('imported:', ', '.join(m for m in {HEAVY_MODULES!r} if m in sys.modules),\n"
    "                                file=sys.stderr))\n"
    "sys.argv = ['dpnoise', *sys.argv[1:]]\n"
    "runpy.run_module('dpnoise', run_name='__main__', alter_sys=True)\n"
)


def imported_heavy_modules(arguments: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Run ``dpnoise arguments`` once: its first line of output and the :data:`HEAVY_MODULES` it
    imported (a failure raises, with its last line of error)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *arguments], env=env, capture_output=True, text=True)
    errors = done.stderr.strip().splitlines()
    if done.returncode != 0 or not errors or not errors[-1].startswith("imported:"):
        raise RuntimeError(f"dpnoise {' '.join(arguments)} failed: {errors[-1:]}")
    first_line = (done.stdout.splitlines() or [""])[0]
    return first_line, errors[-1].removeprefix("imported:").strip()


def print_table(timings: Timings) -> None:
    """One row per command and baseline: median and min seconds, paired ratios to the baselines."""
    print(f"{'process':<40}{'median s':>9}{'min s':>8}{'x pass':>9}{'x numpy':>9}  target")
    for label in [*BASELINES, *COMMANDS]:
        seconds = timings.seconds[label]
        verdict = ("PASS" if timings.median(label) < TARGET_S else "MISS") if label in COMMANDS else ""
        print(f"{label:<40}{timings.median(label):>9.3f}{min(seconds):>8.3f}"
              f"{timings.ratio(label, PASS):>9.1f}{timings.ratio(label, NUMPY):>9.2f}"
              f"  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (every process once per round)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"dpnoise CLI, whole process: {os.cpu_count()} CPUs, load average {load:.2f} at start, {rounds} rounds, "
          f"target < {TARGET_S} s per command on a quiet machine")
    with tempfile.TemporaryDirectory(prefix="bench-cli-pycache-") as pycache:
        env = process_environment(pycache)
        for label in COMMANDS:  # also writes the bytecode caches
            first_line, heavy = imported_heavy_modules(COMMANDS[label], env)
            print(f"  dpnoise {' '.join(COMMANDS[label])}\n    -> {first_line[:100]}\n"
                  f"    imports {heavy or 'none'} of {', '.join(HEAVY_MODULES)}")
        for label in BASELINES:  # their bytecode caches
            subprocess.run(argv_of(label), env=env, check=True)
        timings = interleaved({label: timed_process(argv_of(label), env) for label in [*BASELINES, *COMMANDS]},
                              rounds)
    print_table(timings)


if __name__ == "__main__":
    main()
