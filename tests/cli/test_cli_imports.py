"""The accounting commands import only what their route needs, checked in a fresh interpreter's ``sys.modules``.

Start-up time of ``dpnoise account`` / ``calibrate`` is mostly imports (benchmarks/bench_cli.py): scipy.stats and
scipy.signal cost several times numpy, dp_accounting loads both, torch far more.  A route that computes no PLD
needs none of them; a module-level import of one of them anywhere on the path would load it for every command.
"""

import json
import subprocess
import sys

import pytest

#: Modules a fresh interpreter is asked about after running ``dpnoise`` with the arguments after ``-c``.
WATCHED = ("numpy", "torch", "scipy.stats", "scipy.signal", "scipy.optimize", "dp_accounting", "matplotlib",
           "opacus", "dpnoise.cli.train", "dpnoise.training.config")
#: What a route that computes no PLD must not import.
NOT_FOR_RDP_ROUTES = {"torch", "scipy.stats", "scipy.signal", "scipy.optimize", "dp_accounting", "matplotlib",
                      "opacus"}
PROBE = (
    "import atexit, json, runpy, sys\n"
    f"atexit.register(lambda: print(json.dumps([m for m in {WATCHED!r} if m in sys.modules])))\n"
    "sys.argv = ['dpnoise', *sys.argv[1:]]\n"
    "runpy.run_module('dpnoise', run_name='__main__', alter_sys=True)\n"
)
SEED = ["--sample-rate", "0.0043", "--steps", "5860", "--delta", "1e-5"]


def imported_by(code: str, *arguments: str) -> set[str]:
    """The :data:`WATCHED` modules imported by ``python -c code arguments`` (which must succeed and print
    them as its last line of output)."""
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("arguments", [
    ["account", "--mechanism", "dirichlet", "--noise", "0.25", *SEED],
    ["account", "--mechanism", "dirichlet", "--noise", "0.25", "--json", *SEED],
    ["calibrate", "--mechanism", "dirichlet", "--epsilon", "3.42", *SEED],
], ids=["account", "account-json", "calibrate"])
def test_a_route_without_pld_imports_no_scipy_stats_dp_accounting_or_torch(arguments):
    imported = imported_by(PROBE, *arguments)
    assert "numpy" in imported  # the probe sees what the route does import
    assert imported & NOT_FOR_RDP_ROUTES == set()


@pytest.mark.parametrize("arguments", [
    ["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.01", "--steps", "1000",
     "--delta", "1e-5"],
    ["account", "--mechanism", "lap2", "--noise", "0.5", "--params", "26010", *SEED],
    ["calibrate", "--mechanism", "lap2", "--epsilon", "3.42", "--params", "26010", *SEED],
], ids=["account-gaussian", "account-lap2", "calibrate-lap2"])
def test_a_pld_route_builds_its_pld_without_dp_accounting_scipy_stats_or_torch(arguments):
    """The PLD routes build their single-step PMFs themselves (NumPy and scipy.special): dp_accounting and
    scipy.stats (which it and scipy.signal load) cost more than the rest of the command."""
    imported = imported_by(PROBE, *arguments)
    assert "numpy" in imported
    assert imported & {"dp_accounting", "scipy.stats", "scipy.signal", "scipy.optimize", "torch", "matplotlib",
                       "opacus"} == set()


def test_a_command_builds_only_its_own_parser():
    """``dpnoise account`` does not import the train command's module (nor the training configuration behind its
    options); ``--help`` still lists every command."""
    imported = imported_by(PROBE, "account", "--mechanism", "dirichlet", "--noise", "0.25", *SEED)
    assert imported & {"dpnoise.cli.train", "dpnoise.training.config"} == set()
    listing = subprocess.run([sys.executable, "-m", "dpnoise", "--help"], capture_output=True, text=True, check=True)
    for command in ("account", "calibrate", "walls", "audit", "train"):
        assert command in listing.stdout


def test_importing_the_accounting_package_loads_no_scipy_stats_or_dp_accounting():
    report = f"import json, sys\nprint(json.dumps([m for m in {WATCHED!r} if m in sys.modules]))\n"
    assert imported_by("import dpnoise.accounting\n" + report) & NOT_FOR_RDP_ROUTES == set()
    assert imported_by("import dpnoise\n" + report) == set()  # the package's torch names load on first use
