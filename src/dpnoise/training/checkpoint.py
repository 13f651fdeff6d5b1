"""Checkpoints of a private run: model, optimizer, accountants, sampler/noise RNG, step count.

A run interrupted after k steps and resumed from its checkpoint continues with the same batches
and the same noise as the uninterrupted run: the engine's generators (Poisson sampler and
mechanism noise) and torch's global RNG (dropout, ...) are saved with the accountants' state, so
no step is counted twice or forgotten.

A checkpoint cannot silently misstate the privacy spent.  Format 3 (this module) is a torch file
holding ``{"format": 3, "sha256": hex, "payload": uint8 tensor}``: the payload is the
``torch.save`` serialisation of the whole state, and its SHA-256 is verified before it is read.
Loading a checkpoint never runs code: the state is tensors and plain data only (str, int, float,
bool, None, lists, tuples and dicts; the privacy state is JSON-able), :func:`write_checkpoint_state`
refuses anything else, and both the envelope and the payload are read with
``torch.load(weights_only=True)``, whose unpickler builds nothing else (a file crafted to run code
is refused, unrun).  Resuming then checks the state against the resuming run
(:meth:`PrivacyEngine.load_state_dict`): same privacy setup and seed, a step counter within the
budget, and every accountant's ledger equal to what a fresh accountant records for that many
steps of that setup.  Anything else is refused with one line naming what differs.

**The run record.**  Every checkpoint carries its run's identity (``PrivacyEngine.run_id``), and
:func:`save_checkpoint` records, in the file ``run-record.json`` of the checkpoint's folder, the most
steps the run has taken and the setup it took them with (:mod:`dpnoise.training.run_record`).  A
resume refuses a checkpoint older than the run's latest (which would forget the later steps)
unless it is accepted explicitly (``resume_older=True``; the resumed run then counts every step the
run ever took), and a setup other than the recorded one (a ledger relabelled with another noise).

**Keyed checkpoints.** With a key (:func:`checkpoint_key`: the ``key=`` argument, or the
environment variable ``DPNOISE_CHECKPOINT_KEY``, or a file named by
``DPNOISE_CHECKPOINT_KEY_FILE``; at least 32 bytes, never stored in the checkpoint) the envelope
also carries an HMAC-SHA256 of the payload, and each run-record entry its own, checked before
anything is read: any edit, consistent or not (step counter and ledgers changed together, hash
recomputed, generator states replaced, setup and ledgers relabelled), is refused, and so is a keyed
checkpoint read without its key or an unkeyed one read with a key, and a keyed checkpoint whose
folder has no record of its run.  Use keys wherever a checkpoint leaves your hands.

What the hash alone does and does not do (no key): it catches corrupted and truncated files and
naive edits of the bytes; it is not a signature, so whoever edits a checkpoint on purpose can
recompute it.  The ledger checks catch such edits when they are inconsistent (a ledger shortened,
emptied or removed, a step counter changed without its ledgers, another noise), the run record
catches a checkpoint edited back to fewer steps or relabelled while the record is left alone, and
the generator tags a replaced generator state (:mod:`dpnoise.training.randomness`).  A checkpoint
and its run record edited consistently together still pass: without a key, nothing can tell them
from genuine ones.  :func:`save_checkpoint` says so once per run (:class:`UnkeyedCheckpointWarning`).

Devices and processes: a checkpoint is read onto the CPU (``map_location``) and restored into the
resuming run's model wherever it lives, so a run saved on a GPU resumes on the CPU and back (the
generators, which differ between the two, are then re-seeded: :meth:`PrivacyEngine.load_state_dict`).
In a distributed run every rank calls :func:`save_checkpoint` (the engine gathers every rank's
generators) and rank 0 writes the file; every rank resumes from it, with the same number of ranks.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import random
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from dpnoise.training.engine import PrivacyEngine
from dpnoise.training.errors import (
    CheckpointError,
    CheckpointKeyError,
    CheckpointMismatchError,
    UnkeyedCheckpointWarning,
)
from dpnoise.training.run_record import RUN_RECORD_NAME, record_steps, recorded_steps
from dpnoise.training.sharding import sharded_parameters

CHECKPOINT_FORMAT = 3
#: Environment variables that give the checkpoint key (the key itself, or a file holding it).
KEY_VARIABLE = "DPNOISE_CHECKPOINT_KEY"
KEY_FILE_VARIABLE = "DPNOISE_CHECKPOINT_KEY_FILE"
#: Shortest key accepted (HMAC-SHA256's block of security: 256 bits).
MIN_KEY_BYTES = 32

CheckpointKey = Optional[bytes | str]

#: Keys of the (verified) state inside a checkpoint.
STATE_KEYS = ("format", "module", "optimizer", "engine", "torch_rng", "numpy_rng", "python_rng", "extra")

_ZIP_MAGIC = b"PK\x03\x04"

#: what a checkpoint's state may hold: what ``torch.load(weights_only=True)`` rebuilds without running code
_PLAIN_LEAVES = (str, int, float, bool, type(None), torch.Tensor, nn.Parameter)
_PLAIN_MAPPINGS = (dict, OrderedDict)  # a module's state_dict is an OrderedDict
_PLAIN_SEQUENCES = (list, tuple)

#: runs whose unkeyed checkpoints this process has already warned about (once per run)
_warned_unkeyed_runs: set[str] = set()


def checkpoint_key(key: CheckpointKey = None) -> Optional[bytes]:
    """The checkpoint key: ``key`` (bytes, or a str taken as UTF-8), else ``$DPNOISE_CHECKPOINT_KEY``,
    else the bytes of the file ``$DPNOISE_CHECKPOINT_KEY_FILE``; None when none is set.

    Fails closed, with :class:`CheckpointKeyError` (one line): a key shorter than 32 bytes, a variable
    that is set but empty (e.g. a failed ``$(cat key)``: without the check it would mean "no key"), both
    variables set, an unreadable key file.  Call it before training, so that a bad setting stops the run
    before any step, with or without an output folder.
    """
    source = "key"
    if key is None:
        key, source = _key_from_environment()
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise CheckpointKeyError(f"checkpoint key must be bytes or str, got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise CheckpointKeyError(f"checkpoint key from {source} is {len(key)} bytes; at least {MIN_KEY_BYTES} "
                                 "are needed (e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return key


def _key_from_environment() -> tuple[Optional[bytes | str], str]:
    """(the key the environment gives, where it came from); (None, "") when neither variable is set."""
    given = [name for name in (KEY_VARIABLE, KEY_FILE_VARIABLE) if name in os.environ]
    if len(given) == 2:
        raise CheckpointKeyError(f"checkpoint key: both ${KEY_VARIABLE} and ${KEY_FILE_VARIABLE} are set; set one")
    if not given:
        return None, ""
    name = given[0]
    if not os.environ[name]:
        raise CheckpointKeyError(f"checkpoint key: ${name} is set but empty; give it a value, or unset it to write "
                                 f"checkpoints without a key")
    if name == KEY_VARIABLE:
        return os.environ[name], f"${name}"
    source = f"${name} ({os.environ[name]})"
    try:
        return Path(os.environ[name]).read_bytes(), source
    except OSError as err:
        raise CheckpointKeyError(f"checkpoint key: cannot read {source}: {err.strerror or err}") from None


def _authentication_code(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def save_checkpoint(
    path: str | os.PathLike,
    *,
    module: nn.Module,
    optimizer: Optimizer,
    engine: PrivacyEngine,
    extra: Optional[dict[str, Any]] = None,
    key: CheckpointKey = None,
) -> None:
    """Write the private run's full state to ``path`` (atomically: temp file + rename).

    ``key``: see :func:`checkpoint_key` (default: from the environment; none: unkeyed, and an
    :class:`UnkeyedCheckpointWarning` once per run says what that does not protect).  The run record
    of the checkpoint's folder (``run-record.json``) is updated after the checkpoint is in place, so
    that a process killed in between leaves a record no newer than the checkpoint.  ``extra`` must be
    plain data (see :func:`write_checkpoint_state`).
    In a process group call it on every rank: only rank 0 writes.  A ``fully_shard`` model is refused
    (:func:`refuse_sharded_model`).
    """
    refuse_sharded_model(module, "save_checkpoint")
    engine_state = engine.state_dict()
    state = {
        "format": CHECKPOINT_FORMAT,
        "module": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "engine": engine_state,
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": _numpy_rng_state(),
        "python_rng": random.getstate(),
        "extra": extra or {},
    }
    key = checkpoint_key(key)
    if engine.rank != 0:
        return
    path = Path(path)
    write_checkpoint_state(path, state, key=key)
    record_steps(path.parent, engine.run_id, engine.steps, engine_state["setup"], key)
    if key is None and engine.run_id not in _warned_unkeyed_runs:
        _warned_unkeyed_runs.add(engine.run_id)
        warnings.warn(
            f"{path} is written without a checkpoint key: its SHA-256 detects corruption, not deliberate edits. "
            f"Whoever can write to {path.parent} can change the step counter, the ledgers and the setup in it and in "
            f"{RUN_RECORD_NAME} together, or put back an older checkpoint with its record, and a resume will not "
            f"notice. Set ${KEY_VARIABLE} or ${KEY_FILE_VARIABLE} (a secret of at least {MIN_KEY_BYTES} bytes) to "
            f"have any edit refused. (Shown once per run.)", UnkeyedCheckpointWarning, stacklevel=2)


def refuse_sharded_model(module: nn.Module, what: str) -> None:
    """Raise :class:`CheckpointError` for a ``fully_shard`` model: a checkpoint holds rank 0's model and
    optimizer state, of which rank 0 holds one chunk of each sharded parameter; the other ranks' chunks would be
    lost without a word."""
    sharded = sharded_parameters(module)
    if sharded:
        raise CheckpointError(
            f"{what}: parameter {sharded[0][0]} is sharded by fully_shard, and a checkpoint holds rank 0's model "
            f"and optimizer state, which hold one chunk of it: checkpoints of sharded models are not supported")


def write_checkpoint_state(path: str | os.PathLike, state: dict[str, Any], key: CheckpointKey = None) -> None:
    """Serialise ``state``, hash it (and authenticate it with ``key``, see :func:`checkpoint_key`) and
    write the format-3 envelope to ``path`` atomically.

    ``state`` must be tensors and plain data (str, int, float, bool, None, lists, tuples, dicts), what a
    resume reads back without running code; anything else raises :class:`CheckpointError` naming
    the entry, before anything is written.
    """
    key = checkpoint_key(key)
    _check_plain(state, "state")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    envelope = {
        "format": CHECKPOINT_FORMAT,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    if key is not None:
        envelope["hmac_sha256"] = _authentication_code(key, payload)
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(envelope, temporary)
    os.replace(temporary, path)


def read_checkpoint(path: str | os.PathLike, key: CheckpointKey = None) -> dict[str, Any]:
    """The verified state stored at ``path``, without restoring anything.

    Raises :class:`CheckpointError` (one line with the path and the problem) when the file is
    missing, empty, not a dpnoise checkpoint, of an older format, truncated, or does not match
    its SHA-256 hash; and, with a key (``key`` or the environment, :func:`checkpoint_key`), when
    its HMAC does not match, or it has none; without a key, when it is keyed.
    """
    key = checkpoint_key(key)
    path = Path(path)

    def fail(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: {problem}")

    try:
        with open(path, "rb") as file:
            head = file.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise fail("cannot read checkpoint: no such file") from None
    except IsADirectoryError:
        raise fail("cannot read checkpoint: it is a directory") from None
    except OSError as err:
        raise fail(f"cannot read checkpoint: {err.strerror or err}") from None
    if not head:
        raise fail("not a dpnoise checkpoint: the file is empty")
    if head != _ZIP_MAGIC:
        raise fail("not a dpnoise checkpoint: not a torch archive")
    try:
        envelope = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower():
            raise fail(
                f"not a dpnoise checkpoint of format {CHECKPOINT_FORMAT}: it holds pickled objects, as checkpoints "
                f"of format 1 (earlier dpnoise, no content hash) did; those cannot be resumed, start the run again"
            ) from None
        raise fail(f"truncated or corrupted checkpoint ({_first_line(err)})") from None
    except Exception as err:  # noqa: BLE001  (torch reports damaged archives with many types)
        raise fail(f"truncated or corrupted checkpoint ({_first_line(err)})") from None

    if not isinstance(envelope, dict) or "format" not in envelope:
        raise fail("not a dpnoise checkpoint: no format field")
    if envelope["format"] != CHECKPOINT_FORMAT:
        raise fail(f"checkpoint format {envelope['format']!r} is not supported (this dpnoise reads format "
                   f"{CHECKPOINT_FORMAT} only): start the run again")
    payload, digest = envelope.get("payload"), envelope.get("sha256")
    if not (isinstance(payload, torch.Tensor) and payload.dtype == torch.uint8 and payload.dim() == 1
            and isinstance(digest, str)):
        raise fail("not a dpnoise checkpoint: no payload and hash")
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise fail("checkpoint content does not match its SHA-256 hash (the file is corrupted or was edited)")
    code = envelope.get("hmac_sha256")
    if code is not None and key is None:
        raise fail(f"the checkpoint is keyed: give its key (${KEY_VARIABLE} or ${KEY_FILE_VARIABLE})")
    if key is not None and code is None:
        raise fail("a checkpoint key is set but this checkpoint carries no HMAC: it was written without the key "
                   "(or rewritten by someone without it); refusing it")
    if key is not None and not (isinstance(code, str) and hmac.compare_digest(code, _authentication_code(key, data))):
        raise fail("checkpoint content does not match its HMAC under this key (edited, or another key)")

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower():  # a global torch's safe unpickler does not build: never run it
            raise fail(f"the checkpoint holds objects other than tensors and plain data, which could run code when "
                       f"loaded; refused without loading them ({_unsafe_global(err)})") from None
        raise fail(f"corrupted checkpoint payload ({_first_line(err)})") from None
    except Exception as err:  # noqa: BLE001
        raise fail(f"corrupted checkpoint payload ({_first_line(err)})") from None
    if not isinstance(state, dict):
        raise fail("corrupted checkpoint payload (not a dictionary)")
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise fail(f"incomplete checkpoint: no {', '.join(missing)}")
    if state["format"] != CHECKPOINT_FORMAT:
        raise fail(f"inconsistent checkpoint: payload format {state['format']!r} in a format-{CHECKPOINT_FORMAT} file")
    return state


def load_checkpoint(
    path: str | os.PathLike, *, module: nn.Module, optimizer: Optimizer, engine: PrivacyEngine,
    key: CheckpointKey = None, output_folder: Optional[str | os.PathLike] = None, resume_older: bool = False,
) -> dict[str, Any]:
    """Restore a checkpoint into objects built by ``make_private`` with the same setup and seed.

    The file is verified first (:func:`read_checkpoint`, with ``key`` or the environment's:
    :class:`CheckpointError`), then the model's parameter names and shapes, the engine state
    (:meth:`PrivacyEngine.check_state_dict`) and the run record (``run-record.json``) of the
    checkpoint's folder and of ``output_folder`` (where the resumed run will write its checkpoints,
    when elsewhere): any difference raises :class:`CheckpointMismatchError` naming the field,
    before the model or the engine is changed.  A keyed checkpoint needs its run's record in its own
    folder (copy ``run-record.json`` with it).

    A checkpoint with fewer steps than the run record holds for its run is older than the run's latest
    and refused, unless ``resume_older``: then it is restored and the steps the run took after it are
    counted (:meth:`PrivacyEngine.account_later_steps`), so the resumed run starts at the recorded step
    count with every step the run ever took in its accountants.

    Returns the checkpoint's ``extra`` dictionary, with ``"steps"`` (steps already taken) added.
    """
    refuse_sharded_model(module, "load_checkpoint")
    key = checkpoint_key(key)
    state = read_checkpoint(path, key=key)
    _check_module_state(state["module"], module)
    engine.check_state_dict(state["engine"])
    taken = _steps_the_run_took(Path(path), state["engine"], key, output_folder)
    saved_steps = state["engine"]["steps"]
    if taken > saved_steps and not resume_older:
        raise CheckpointMismatchError(
            f"{path} is older than its run's latest checkpoint: it holds {saved_steps} steps, the run took {taken} "
            f"({RUN_RECORD_NAME}); resuming it would forget {taken - saved_steps} steps. Resume the latest checkpoint, "
            f"or accept this one explicitly (resume_older=True, dpnoise train --resume-older), which counts every "
            f"step the run took")
    engine.load_state_dict(state["engine"])
    module.load_state_dict(state["module"])
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointMismatchError(f"checkpoint differs from this run in optimizer: {_first_line(err)}") from None
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    if taken > saved_steps:
        engine.account_later_steps(taken)
    return {**state["extra"], "steps": engine.steps}


def _steps_the_run_took(path: Path, engine_state: dict[str, Any], key: Optional[bytes],
                        output_folder: Optional[str | os.PathLike]) -> int:
    """The most steps the checkpoint's run has taken: its own count, or more where the run record of the checkpoint's
    folder or of ``output_folder`` holds more.  A keyed checkpoint's folder must hold a record of its run."""
    run_id, setup, steps = engine_state["run_id"], engine_state["setup"], engine_state["steps"]
    folders = [path.parent]
    if output_folder is not None and Path(output_folder).resolve() != path.parent.resolve():
        folders.append(Path(output_folder))
    recorded = [recorded_steps(folder, run_id, setup, key) for folder in folders]
    if key is not None and recorded[0] is None:
        raise CheckpointError(f"{path}: a keyed checkpoint is resumed only with its run's record, and "
                              f"{path.parent / RUN_RECORD_NAME} holds none of run {run_id} (copy the run's "
                              f"{RUN_RECORD_NAME} with its checkpoints)")
    return max([steps, *(count for count in recorded if count is not None)])


def _check_module_state(saved: Any, module: nn.Module) -> None:
    """Same parameter and buffer names and shapes as ``module`` (else :class:`CheckpointMismatchError`)."""
    if not isinstance(saved, dict):
        raise CheckpointMismatchError("checkpoint is inconsistent in model: its state is not a dictionary")
    current = module.state_dict()
    only_saved = [key for key in saved if key not in current]
    only_current = [key for key in current if key not in saved]
    if only_saved or only_current:
        raise CheckpointMismatchError(
            f"checkpoint differs from this run in model: tensors {_names(only_saved)} (checkpoint) "
            f"vs {_names(only_current)} (this run)"
        )
    for key, tensor in current.items():
        other = saved[key]
        if not isinstance(tensor, torch.Tensor):
            continue  # extra state of a layer (any object): its own load_state_dict checks it
        if not isinstance(other, torch.Tensor) or other.shape != tensor.shape:
            shape = tuple(other.shape) if isinstance(other, torch.Tensor) else type(other).__name__
            raise CheckpointMismatchError(
                f"checkpoint differs from this run in model tensor {key}: {shape} (checkpoint) vs "
                f"{tuple(tensor.shape)} (this run)"
            )


def _names(keys: list[str], limit: int = 3) -> str:
    if not keys:
        return "none"
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _first_line(err: BaseException) -> str:
    """The first sentence of an error's message (torch appends paragraphs of advice)."""
    text = str(err).strip()
    if not text:
        return type(err).__name__
    return text.splitlines()[0].split(". ")[0].rstrip(".")


def _unsafe_global(err: pickle.UnpicklingError) -> str:
    """What torch's safe unpickler refused to build, e.g. ``posix.system`` (its message is a page of advice)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    return f"it would call {found.group(1)}" if found else _first_line(err)


def _check_plain(value: Any, where: str) -> None:
    """Raise :class:`CheckpointError` naming the first entry of ``value`` that is not a tensor or plain data."""
    if type(value) in _PLAIN_LEAVES:
        return
    if type(value) in _PLAIN_MAPPINGS:
        for key, item in value.items():
            _check_plain(key, f"{where} key {key!r}")
            _check_plain(item, f"{where}[{key!r}]")
        return
    if type(value) in _PLAIN_SEQUENCES:
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
        return
    raise CheckpointError(f"checkpoint {where} is a {type(value).__module__}.{type(value).__qualname__}: a checkpoint "
                          f"holds tensors and plain data only (str, int, float, bool, None, lists, tuples, dicts), "
                          f"so that loading one never runs code")


def _numpy_rng_state() -> dict[str, Any]:
    """NumPy's global generator state as plain data (:func:`numpy.random.set_state` takes it back)."""
    state = np.random.get_state(legacy=False)
    return {**state, "state": {"key": state["state"]["key"].tolist(), "pos": int(state["state"]["pos"])}}
