"""The run record: the newest step count of each run, kept next to its checkpoints.

A checkpoint holds the step counter and the ledgers of the moment it was written; on its own it
cannot tell whether the run went further.  Resuming an older checkpoint of a run (an earlier copy,
or ``epoch2.pt`` after ``epoch4.pt`` was written) would make the accountants forget every step taken
after it, although those steps touched the data and their results may have been released.  So every
:func:`~dpnoise.training.checkpoint.save_checkpoint` also writes, into the checkpoint's folder, the
file ``run-record.json``: for each run (by the run id that its checkpoints carry) the most steps it
has taken and the privacy setup it took them with.  A resume compares the checkpoint with that
record: a checkpoint with fewer steps than the record is older than the run's latest, and a setup
other than the recorded one (a ledger relabelled with another noise, say) is not what the run did.

With a checkpoint key each entry carries an HMAC-SHA256 under that key (domain-separated from the
checkpoints' own), so an entry cannot be forged or lowered, only replaced by an older genuine one.
Without a key the record guards against mistakes, not against someone who edits it.

The file is JSON: ``{"format": 1, "runs": {run_id: {"steps": k, "setup": {...}, "hmac_sha256": hex}}}``
(``hmac_sha256`` only for keyed runs).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Optional

from dpnoise.training.errors import CheckpointError, CheckpointMismatchError

#: file name of the run record, in the folder of the checkpoints it describes
RUN_RECORD_NAME = "run-record.json"
RUN_RECORD_FORMAT = 1
#: prefix of the authenticated message, so that a record entry's HMAC can never pass for a checkpoint's
_HMAC_DOMAIN = b"dpnoise run record 1\n"


def run_record_path(folder: str | os.PathLike) -> Path:
    """The run record of the checkpoints in ``folder``."""
    return Path(folder) / RUN_RECORD_NAME


def plain_setup(setup: dict[str, Any]) -> dict[str, Any]:
    """A privacy setup as JSON gives it back (tuples as lists), so that a recorded and a current one compare."""
    return json.loads(json.dumps(setup))


def recorded_steps(folder: str | os.PathLike, run_id: str, setup: dict[str, Any],
                   key: Optional[bytes]) -> Optional[int]:
    """The most steps the record in ``folder`` holds for run ``run_id`` (None: no record of that run), after checking
    that the entry is authentic under ``key`` and that the run took its steps with ``setup``.

    Raises :class:`CheckpointError` for a record that cannot be read or an entry that is not authentic (an HMAC that
    does not match, a keyed entry read without a key, an unkeyed one read with a key), and
    :class:`CheckpointMismatchError` naming the first setup field that differs from the recorded one.
    """
    path = run_record_path(folder)
    entry = _read_record(path).get(run_id)
    if entry is None:
        return None
    if not _authentic(entry, run_id, key):
        raise CheckpointError(f"{path}: the record of run {run_id} is not authentic under "
                              + ("this checkpoint key (edited, or written without the key)" if key is not None else
                                 "no key: it was written with a checkpoint key, give that key"))
    setup = plain_setup(setup)
    for field in sorted(set(entry["setup"]) | set(setup)):
        recorded, current = entry["setup"].get(field), setup.get(field)
        if recorded != current:
            raise CheckpointMismatchError(f"{path} records that run {run_id} took its steps with {field} {recorded!r}; "
                                          f"this run has {current!r} (the checkpoint's ledgers do not say what the run "
                                          f"did)")
    return entry["steps"]


def record_steps(folder: str | os.PathLike, run_id: str, steps: int, setup: dict[str, Any],
                 key: Optional[bytes]) -> None:
    """Record in ``folder`` that run ``run_id`` took ``steps`` steps with ``setup`` (atomically: temp file + rename).

    The record never goes down: an authentic entry of more steps keeps its count (the run went further than the
    checkpoint just written, which is then older than its latest).  Other runs' entries are kept.
    """
    path = run_record_path(folder)
    runs = _read_record(path)
    previous = runs.get(run_id)
    if previous is not None and _authentic(previous, run_id, key):
        steps = max(steps, previous["steps"])
    runs[run_id] = _entry(run_id, steps, plain_setup(setup), key)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"format": RUN_RECORD_FORMAT, "runs": runs}, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)


def _entry(run_id: str, steps: int, setup: dict[str, Any], key: Optional[bytes]) -> dict[str, Any]:
    entry: dict[str, Any] = {"steps": steps, "setup": setup}
    if key is not None:
        entry["hmac_sha256"] = _authentication_code(key, run_id, steps, setup)
    return entry


def _authentication_code(key: bytes, run_id: str, steps: int, setup: dict[str, Any]) -> str:
    message = json.dumps({"run_id": run_id, "steps": steps, "setup": setup}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, _HMAC_DOMAIN + message.encode(), hashlib.sha256).hexdigest()


def _authentic(entry: dict[str, Any], run_id: str, key: Optional[bytes]) -> bool:
    """The entry carries an HMAC under ``key`` that matches, or (no key) carries none."""
    code = entry.get("hmac_sha256")
    if key is None:
        return code is None
    return isinstance(code, str) and hmac.compare_digest(
        code, _authentication_code(key, run_id, entry["steps"], entry["setup"]))


def _read_record(path: Path) -> dict[str, dict[str, Any]]:
    """The entries of the record at ``path`` by run id ({} when there is none); :class:`CheckpointError` naming the
    file when it is not a run record."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the run record: {err.strerror or err}") from None
    try:
        record = json.loads(text)
    except ValueError:
        raise CheckpointError(f"{path}: not a dpnoise run record (not JSON)") from None
    if not (isinstance(record, dict) and record.get("format") == RUN_RECORD_FORMAT
            and isinstance(record.get("runs"), dict)):
        raise CheckpointError(f"{path}: not a dpnoise run record of format {RUN_RECORD_FORMAT}")
    for run_id, entry in record["runs"].items():
        if not (isinstance(entry, dict) and _is_step_count(entry.get("steps")) and isinstance(entry.get("setup"), dict)
                and set(entry) <= {"steps", "setup", "hmac_sha256"}):
            raise CheckpointError(f"{path}: the record of run {run_id} is not a step count and a setup")
    return record["runs"]


def _is_step_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
