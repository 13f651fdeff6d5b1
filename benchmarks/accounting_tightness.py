"""How tight the default epsilon is: dpnoise's default accountant vs the tightest reference available.

For each setting (mechanism, noise, q, T, delta) the reference is

* the exact value where there is one: T Gaussian steps at q = 1 are sqrt(T)/sigma-GDP (Dong, Roth
  & Su, arXiv 1905.02383, closed form solved here with SciPy); lap2's GDP route at q = 1 is
  sqrt(T) M_n-GDP; one Laplace step at q = 1 has eps(delta) = C/b + 2 log(1 - delta).  For lap2 the
  ratio is that of its GDP route (lap2-gdp) to the exact value of the GDP bound it computes, which
  is an upper bound on Lap2, not its exact epsilon; the default (the smaller of lap2-gdp and lap2-rdp)
  is shown beside it;
* else the smallest of Google's dp_accounting PLD (pessimistic connect-the-dots, the finest grid
  that stays affordable, 1e-6 to 0.1) and Opacus's PRV accountant (its upper estimate; Gaussian
  noise only).  Neither bounds its floating-point round-off, so at tiny deltas they can dip below
  the truth; on coarse grids (per-step losses below the grid, e.g. q = 1e-8) they are loose.

Beside it, a lower bound: dp_accounting's optimistic PLD at the same grid (q < 1).  Every reference
runs in its own process under a time limit; a reference that does not finish is left out.

    python benchmarks/accounting_tightness.py [--out results/accounting_tightness] [--timeout 600]

prints a Markdown table (default / reference ratio, worst and median) and writes it with a JSON
record of every row.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

#: (mechanism, noise, sample rate, steps, delta, params): noise is sigma for gaussian, b/C otherwise.
SETTINGS = [
    ("gaussian", 0.05, 1e-6, 1000, 1e-5, None),
    ("gaussian", 1.0, 1e-4, 100_000, 1e-12, None),
    ("gaussian", 0.6, 1e-3, 100_000, 1e-8, None),
    ("gaussian", 8.0, 1.0, 1000, 1e-12, None),
    ("gaussian", 1000.0, 1.0, 10, 1e-15, None),
    ("gaussian", 8.0, 1.0, 1000, 1e-15, None),
    ("gaussian", 0.8, 1.0, 1, 1e-5, None),
    ("gaussian", 2.0, 1.0, 10, 1e-10, None),
    ("gaussian", 30.0, 1.0, 100_000, 1e-15, None),
    ("gaussian", 20.0, 1.0, 10_000_000, 1e-12, None),
    ("gaussian", 1.1, 0.01, 2000, 1e-5, None),
    ("gaussian", 0.7928, 258 / 60000, 5860, 1e-5, None),
    ("gaussian", 1.0, 0.01, 10_000, 1e-8, None),
    ("gaussian", 2.0, 0.01, 100_000, 1e-12, None),
    ("gaussian", 0.5, 0.3, 1000, 1e-12, None),
    ("gaussian", 5.0, 0.5, 10_000, 1e-12, None),
    ("gaussian", 1.0, 1e-8, 10_000_000, 1e-5, None),
    ("gaussian", 0.3, 1e-6, 1_000_000, 1e-8, None),
    ("gaussian", 4.0, 1e-3, 10_000_000, 1e-10, None),
    ("gaussian", 1.5, 1e-3, 1_000_000, 1e-15, None),
    ("gaussian", 0.6, 0.05, 1000, 1e-15, None),
    ("gaussian", 3.0, 0.1, 100_000, 1e-10, None),
    ("gaussian", 0.05, 1e-8, 10_000_000, 1e-5, None),
    ("gaussian", 10.0, 0.2, 10_000, 1e-15, None),
    ("gaussian", 1.0, 1e-3, 10_000, 1e-5, None),
    ("gaussian", 0.9, 0.02, 3000, 1e-15, None),
    ("gaussian", 2.0, 1e-5, 10_000_000, 1e-12, None),
    ("gaussian", 0.6, 1e-3, 100_000, 1e-15, None),
    ("gaussian", 1.0, 1e-4, 100_000, 1e-5, None),
    ("gaussian", 8.0, 0.01, 1000, 1e-12, None),
    ("gaussian", 1.2, 0.004, 100_000, 1e-10, None),
    ("gaussian", 0.1, 1e-5, 10_000, 1e-8, None),
    ("lap2", 0.5, 1.0, 100, 1e-5, 1),
    ("lap2", 2.0, 1.0, 1000, 1e-15, 26_010),
    ("lap2", 1.0, 0.01, 1000, 1e-8, 100_000),
    ("lap2", 0.5, 0.01, 1000, 1e-5, 100_000),
    ("lap2", 3.0, 0.004, 10_000, 1e-12, 22_700_000),
    ("lap2", 1.0, 1e-4, 100_000, 1e-15, 1_000_000),
    ("laplace-l1", 0.3, 1.0, 1, 1e-12, None),
    ("laplace-l1", 2.0, 1.0, 1, 1e-15, None),
    ("laplace-l1", 1.0, 0.01, 1000, 1e-5, None),
    ("laplace-l1", 5.0, 0.1, 10_000, 1e-8, None),
    ("laplace-l1", 10.0, 1e-3, 100_000, 1e-12, None),
    ("laplace-l1", 0.5, 1e-4, 10_000, 1e-15, None),
]


def gdp_epsilon(mu: float, delta: float) -> float:
    """Exact eps(delta) of mu-GDP: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in log space."""
    from scipy.optimize import brentq
    from scipy.special import log_ndtr

    def log_delta(eps: float) -> float:
        a, b = log_ndtr(-eps / mu + mu / 2), eps + log_ndtr(-eps / mu - mu / 2)
        return a + math.log(-math.expm1(b - a)) if b < a else -math.inf

    if log_delta(0.0) <= math.log(delta):
        return 0.0
    high = 1.0
    while log_delta(high) > math.log(delta):
        high *= 2.0
    return brentq(lambda eps: log_delta(eps) - math.log(delta), 0.0, high, xtol=1e-13, rtol=1e-13)


def dpnoise_epsilon(accountant: str, mechanism: str, noise: float, q: float, steps: int, delta: float,
                    params) -> tuple[float, str]:
    from dpnoise.accounting import get_accountant

    keyword = {"noise_multiplier": noise} if mechanism == "gaussian" else {"laplace_scale": noise, "clip": 1.0}
    if params is not None:
        keyword["params"] = params
    return get_accountant(accountant).step(sample_rate=q, steps=steps, **keyword).get_epsilon_and_bound(delta)


def _gaussian_sigma(mechanism: str, noise: float, params) -> float:
    """The Gaussian noise multiplier whose sampled mechanism the reference accounts (lap2: 1/M_n)."""
    if mechanism == "lap2":
        from dpnoise.accounting.pld.gdp import lap2_gdp_mu

        return 1.0 / lap2_gdp_mu(noise, params)
    return noise


def _google_pld(mechanism: str, noise: float, q: float, steps: int, delta: float, pessimistic: bool) -> tuple[float, float]:
    """(epsilon, grid) of dp_accounting's PLD at the finest grid whose single step stays under 400,000 points,
    its tails truncated far below delta."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    if mechanism == "laplace-l1":
        max_loss = 1.0 / noise
        build = pld_lib.from_laplace_mechanism
    else:
        max_loss = 10.0 / noise + 0.5 / noise**2
        build = pld_lib.from_gaussian_mechanism
    width = 2.0 * float(np.logaddexp(np.log1p(-q), np.log(q) + max_loss)) if q < 1 else 2.0 * max_loss
    for grid in (1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 1e-2, 1e-1):
        if width / grid <= 400_000:
            pld = build(noise, pessimistic_estimate=pessimistic, value_discretization_interval=grid, sampling_prob=q,
                        use_connect_dots=pessimistic)
            composed = pld.self_compose(steps, tail_mass_truncation=min(1e-15, delta * 1e-3))
            return composed.get_epsilon_for_delta(delta), grid
    raise ArithmeticError("no affordable grid")


def _opacus_prv(sigma: float, q: float, steps: int, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [(sigma, q, steps)]
    return accountant.get_epsilon(delta)


def reference(mechanism: str, noise: float, q: float, steps: int, delta: float, params) -> dict:
    """The row's reference values (computed in a child process)."""
    warnings.simplefilter("ignore")
    if q == 1.0 and mechanism in ("gaussian", "lap2"):
        return {"reference": gdp_epsilon(math.sqrt(steps) / _gaussian_sigma(mechanism, noise, params), delta), "source": "exact (GDP)"}
    if q == 1.0 and steps == 1 and mechanism == "laplace-l1":
        return {"reference": max(0.0, 1.0 / noise + 2.0 * math.log1p(-delta)), "source": "exact (Laplace)"}
    kind = "laplace-l1" if mechanism == "laplace-l1" else "gaussian"
    noise_of_reference = noise if kind == "laplace-l1" else _gaussian_sigma(mechanism, noise, params)
    candidates, lower, grid = {}, None, None
    try:
        candidates["PLD"], grid = _google_pld(kind, noise_of_reference, q, steps, delta, True)
        lower = _google_pld(kind, noise_of_reference, q, steps, delta, False)[0]
    except (ArithmeticError, ValueError, MemoryError) as err:
        candidates["PLD error"] = str(err)[:80]
    if kind == "gaussian":
        print(json.dumps(_summary(candidates, lower, grid)), flush=True)  # what the parent keeps if PRV times out
        try:
            candidates["PRV"] = _opacus_prv(noise_of_reference, q, steps, delta)
        except Exception as err:  # noqa: BLE001 (a reference that fails is reported, not fatal)
            candidates["PRV error"] = str(err)[:80]
    return _summary(candidates, lower, grid)


def _summary(candidates: dict, lower, grid) -> dict:
    finite = {name: value for name, value in candidates.items() if isinstance(value, float) and math.isfinite(value)}
    if not finite:
        return {"reference": None, "source": "; ".join(f"{k}: {v}" for k, v in candidates.items())}
    source = min(finite, key=finite.get)
    label = f"{source} (grid {grid:g})" if source == "PLD" else source
    return {"reference": finite[source], "source": label, "lower_bound": lower, "candidates": finite}


def _row_in_child(index: int, timeout: float) -> dict:
    """The last summary the child printed (the PLD one when the PRV does not finish in time)."""
    try:
        run = subprocess.run([sys.executable, __file__, "--row", str(index)], capture_output=True, text=True, timeout=timeout)
        output = run.stdout
    except subprocess.TimeoutExpired as err:
        output = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    lines = output.strip().splitlines()
    if not lines:
        return {"reference": None, "source": f"no reference within {timeout:g} s"}
    return json.loads(lines[-1])


#: Below this delta dp_accounting's and the PRV's own round-off can exceed delta (their optimistic value then
#: exceeds their pessimistic one): such references are shown but not summarised.
RELIABLE_DELTA = 1e-10


def rdp_upper_bound(record: dict) -> float:
    """A proven upper bound on what the reference and lower bound compute: the RDP route of the same mechanism
    (lap2: the Gaussian at 1/M_n, which its references account)."""
    from dpnoise.accounting import get_accountant

    mechanism, q, steps = record["mechanism"], record["sample_rate"], record["steps"]
    if mechanism == "laplace-l1":
        accountant = get_accountant("laplace-l1-rdp").step(laplace_scale=record["noise"], clip=1.0, sample_rate=q, steps=steps)
    else:
        sigma = _gaussian_sigma(mechanism, record["noise"], record["params"])
        accountant = get_accountant("gaussian-rdp").step(noise_multiplier=sigma, sample_rate=q, steps=steps)
    return accountant.get_epsilon(record["delta"])


def reliable(record: dict) -> bool:
    """An exact reference, or a library one at delta >= RELIABLE_DELTA whose optimistic PLD is neither above
    its pessimistic one nor above a proven upper bound (where it is, round-off has swamped them)."""
    if record["source"].startswith("exact"):
        return True
    pessimistic, optimistic = record.get("candidates", {}).get("PLD"), record.get("lower_bound")
    ceiling = min((value for value in (pessimistic, record.get("rdp_upper_bound")) if value is not None), default=math.inf)
    return record["delta"] >= RELIABLE_DELTA and (optimistic is None or optimistic <= ceiling)


def summarize(records: list[dict]) -> str:
    """Worst and median ratio per kind of reference (reliable ones only); settings below a reliable lower bound
    (lap2: its GDP route, which the references and lower bounds are those of)."""
    groups = {
        "exact references": [r for r in records if r["ratio"] is not None and r["source"].startswith("exact")],
        f"dp_accounting / PRV references at delta >= {RELIABLE_DELTA:g}, self-consistent": [
            r for r in records if r["ratio"] is not None and not r["source"].startswith("exact") and reliable(r)],
    }
    lines = []
    for name, rows in groups.items():
        ratios = [r["ratio"] for r in rows]
        lines.append(f"{name}: {len(ratios)} settings, worst ratio {max(ratios):.4f}, median {statistics.median(ratios):.4f}")
    below = [r for r in records if r.get("lower_bound") and reliable(r) and r["compared"] < r["lower_bound"]]
    lines.append(f"{len(below)} settings below a reliable lower bound; {sum(r['ratio'] is None for r in records)} "
                 f"without a reference; {sum(not reliable(r) for r in records)} references shown only (†)")
    return "\n" + "\n".join(lines)


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.6g}"


HEADER = [
    "| mechanism | noise | q | T | delta | dpnoise default | route | reference | source | ratio | lower bound |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def table_row(record: dict) -> str:
    """One Markdown row; a reference below RELIABLE_DELTA that is not exact is marked (its round-off is unbounded)."""
    noise = f"{record['noise']:g}" + (f" (n={record['params']:g})" if record["params"] else "")
    source = record["source"] + (" †" if not reliable(record) and record.get("reference") else "")
    ratio = _fmt(record["ratio"]) + (" (lap2-gdp)" if record["mechanism"] == "lap2" and record["ratio"] else "")
    return (f"| {record['mechanism']} | {noise} | {record['sample_rate']:.3g} | {record['steps']:g} | {record['delta']:g} "
            f"| {record['epsilon']:.6g} | {record['route']} | {_fmt(record.get('reference'))} | {source} | {ratio} "
            f"| {_fmt(record.get('lower_bound'))} |")


def measure(index: int, timeout: float, references: Optional[dict] = None) -> dict:
    """The record of SETTINGS[index]: dpnoise's default epsilon and the references (measured, or taken
    from ``references``, an earlier record of the same setting: they do not depend on dpnoise)."""
    mechanism, noise, q, steps, delta, params = SETTINGS[index]
    started = time.perf_counter()
    epsilon, bound = dpnoise_epsilon(mechanism, mechanism, noise, q, steps, delta, params)
    seconds = time.perf_counter() - started
    row = _references_of(references) if references is not None else _row_in_child(index, timeout)
    # lap2's references are those of its GDP route (an upper bound, not the truth): that route is compared
    compared = dpnoise_epsilon("lap2-gdp", mechanism, noise, q, steps, delta, params)[0] if mechanism == "lap2" else epsilon
    ratio = compared / row["reference"] if row.get("reference") else None
    record = {"mechanism": mechanism, "noise": noise, "sample_rate": q, "steps": steps, "delta": delta, "params": params,
              "epsilon": epsilon, "route": bound.split(":")[0], "seconds": seconds, "compared": compared, "ratio": ratio,
              **row}
    return record | {"rdp_upper_bound": rdp_upper_bound(record)}


REFERENCE_FIELDS = ("reference", "source", "lower_bound", "candidates")


def _references_of(record: dict) -> dict:
    """The reference fields of an earlier record."""
    return {key: record[key] for key in REFERENCE_FIELDS if key in record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/accounting_tightness", help="path prefix of the .md and .json written")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to each row's references")
    parser.add_argument("--rows", type=int, nargs="+", help="measure only these settings (indices into SETTINGS) and "
                        "replace their records in an existing --out .json")
    parser.add_argument("--row", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the existing .json")
    parser.add_argument("--keep-references", action="store_true",
                        help="measure dpnoise's epsilons again but take every reference and lower bound from the "
                        "existing .json (they come from other libraries, which dpnoise's code does not change)")
    args = parser.parse_args()
    if args.row is not None:
        print(json.dumps(reference(*SETTINGS[args.row])))
        return
    out = Path(args.out)
    earlier = args.rows or args.render or args.keep_references
    records = json.loads(out.with_suffix(".json").read_text()) if earlier else [None] * len(SETTINGS)
    for index in [] if args.render else args.rows or range(len(SETTINGS)):
        records[index] = measure(index, args.timeout, records[index] if args.keep_references else None)
        print(table_row(records[index]), flush=True)
    for record in records:
        record.setdefault("rdp_upper_bound", rdp_upper_bound(record))
    summary = summarize(records)
    print(summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    note = (f"\n† not summarised: dp_accounting / PRV below delta = {RELIABLE_DELTA:g}, or with an optimistic PLD above "
            f"the pessimistic one (their round-off is not bounded).\n")
    out.with_suffix(".md").write_text("\n".join(HEADER + [table_row(r) for r in records]) + "\n" + note + summary + "\n")
    out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
