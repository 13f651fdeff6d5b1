"""Exact lower bounds on the true epsilon of runs calibrated by an accountant that is not a valid bound.

A run calibrated by ``lap2-paper``, or by the Dirichlet paper's add/remove reading of an output mechanism,
claims its target epsilon; :func:`dpnoise.audit.bound.audit_bound` computes, for the same noise, sampling
rate, steps and model size (and alpha), a proven lower bound on the true epsilon (exact PLD of a feasible
pair, docs/theory/lap2.md §3, docs/theory/dirichlet.md).  A lower bound above the target refutes the
claim.  Bounds are cached per experiment in ``lower_bounds.json`` (they take seconds to a minute
each and are the same for every seed and dataset that share the setting).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from dpnoise.accounting import ACCOUNTANTS, MECHANISMS, epsilon_after, noise_keywords
from reproductions.records import LOWER_BOUNDS_FILE

logger = logging.getLogger(__name__)
#: What fixes the bound: the accountant names the mechanism, the rest its parameters.
BOUND_KEYS = ("calibrated_with", "noise", "sample_rate", "steps_taken", "params", "clip", "delta", "alpha")


def needs_lower_bound(row: dict[str, Any]) -> bool:
    """Rows whose noise was calibrated by an unsound accountant (their claim may be false)."""
    return row.get("status") == "ok" and not ACCOUNTANTS[row["calibrated_with"]].sound


def bound_key(row: dict[str, Any]) -> dict[str, Any]:
    return {"calibrated_with": row["calibrated_with"], "noise": row["noise"], "sample_rate": row["sample_rate"],
            "steps_taken": max(row["steps"]), "params": row["params"], "clip": row["clip"], "delta": row["delta"],
            "alpha": row.get("alpha")}


def compute_lower_bound(key: dict[str, Any]) -> float:
    """The exact lower bound on eps(delta) for ``key`` (see :func:`dpnoise.audit.bound.audit_bound`)."""
    from dpnoise.audit.bound import audit_bound

    result = audit_bound(key["calibrated_with"], key["noise"], key["sample_rate"], key["steps_taken"], key["delta"],
                         clip=key["clip"], params=key["params"], alpha=key.get("alpha"))
    return float(result["lower_bound_epsilon"])


def annotate_lower_bounds(rows: Sequence[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """``rows`` with ``lower_bound_epsilon`` on those calibrated by an unsound accountant
    (computed once, then read from ``folder/lower_bounds.json``)."""
    cache_path = Path(folder) / LOWER_BOUNDS_FILE
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else []
    out = []
    for row in rows:
        if needs_lower_bound(row):
            key = bound_key(row)
            hit = next((c for c in cache if all(c.get(k) == key[k] for k in BOUND_KEYS)), None)
            if hit is None:
                logger.info("exact lower bound for %s", key)
                hit = {**key, "lower_bound_epsilon": compute_lower_bound(key)}
                cache.append(hit)
                cache_path.write_text(json.dumps(cache, indent=1) + "\n")
            row = {**row, "lower_bound_epsilon": hit["lower_bound_epsilon"]}
            if not any(ACCOUNTANTS[name].sound for name in row["epsilon_by_accountant"]):
                row["sound_epsilon"] = sound_epsilon(row)  # records of lap2-paper runs hold lap2's already
        out.append(row)
    return out


def sound_epsilon(row: dict[str, Any]) -> float:
    """The epsilon of ``row``'s noise, sampling rate and steps under its mechanism's sound default accountant
    (the upper end of the interval its true epsilon lies in)."""
    mechanism = ACCOUNTANTS[row["calibrated_with"]].mechanism
    return float(epsilon_after(MECHANISMS[mechanism].default_accountant, steps=max(row["steps"]), delta=row["delta"],
                               sample_rate=row["sample_rate"], clip=row["clip"], params=row["params"],
                               alpha=row.get("alpha"), **noise_keywords(mechanism, row["noise"])))
