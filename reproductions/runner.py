"""Run one :class:`RunSpec` through :func:`dpnoise.training.train_private` and write its JSON record.

Every run is exactly a ``dpnoise train`` command line (:func:`train_argv`, recorded in the record, so
any number can be reproduced by hand): :func:`train_config` builds the same configuration that
command builds.  It runs in this process with one torch thread and its outputs (metrics.json, CSVs,
curves, checkpoint) go to a work folder.  Every run logs the loss, accuracy and size of its private
batches (``--log-private-batch-stats``: without noise, outside the epsilon; the data sets are public),
which the per-step tools read (``tools/step_windows.py``).  A run whose record exists is skipped, so
a killed batch resumes where it stopped.
"""

from __future__ import annotations

import datetime
import functools
import logging
import multiprocessing
import os
import platform
import shlex
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from dpnoise.accounting import UnreachableTargetError
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.data import dataset_info
from reproductions.errors import PlanMismatchError
from reproductions.records import RunSpec, record_path, write_record

if TYPE_CHECKING:  # annotations only: torch is imported by the first run
    from dpnoise.training import TrainingConfig, TrainingResult

logger = logging.getLogger(__name__)

#: Torch threads per training process (the reproduction machine has 2 shared cores).
DEFAULT_THREADS = 1


def train_size(spec: RunSpec) -> int:
    """Number of training examples the run samples from."""
    return spec.train_limit or dataset_info(spec.dataset).train_size


def epochs_for_steps(spec: RunSpec) -> float:
    """Epochs E with ceil(E / q) = ``spec.steps`` for q = batch / N (what ``dpnoise train`` plans)."""
    return spec.steps * spec.batch_size / train_size(spec)


def train_argv(spec: RunSpec, out_dir: Path, threads: int = DEFAULT_THREADS) -> list[str]:
    """The ``dpnoise train`` arguments (after ``train``) that run ``spec``: :func:`train_config`'s configuration
    written as flags (:func:`dpnoise.training.config.to_argv`), and ``--json``."""
    from dpnoise.training.config import to_argv

    return [*to_argv(train_config(spec, out_dir, threads)), "--json"]


def train_config(spec: RunSpec, out_dir: Path, threads: int = DEFAULT_THREADS) -> TrainingConfig:
    """The configuration of ``spec``'s fields (:meth:`RunSpec.configuration_fields`), with the epochs of its
    planned steps, its output in ``out_dir`` and ``threads``: what :func:`train_argv`'s command line builds
    (the same values: numbers have the flags' types, as the command line parses them)."""
    from dpnoise.training import TrainingConfig
    from dpnoise.training.config import MECHANISM_OPTIONS, OPTIONS

    values: dict[str, Any] = {"privacy.epochs": epochs_for_steps(spec), "output.folder": Path(out_dir),
                              "output.progress": False, "output.log_private_batch_stats": True, "threads": threads}
    options: dict[str, Any] = {}
    for path, value in spec.configuration_fields().items():
        if path.startswith(MECHANISM_OPTIONS + "."):
            options[path[len(MECHANISM_OPTIONS) + 1:]] = value
        else:
            values[path] = float(value) if OPTIONS[path].type is float else value
    return TrainingConfig.from_fields({**values, **({MECHANISM_OPTIONS: options} if options else {})})


@functools.lru_cache(maxsize=None)
def git_state(repo: Path) -> dict[str, Any]:
    """Commit of ``repo`` and whether its ``src/`` differs from it (None outside a checkout).

    Taken once per process, before its first run imports the training code: a long-running
    worker keeps the code it imported, so later commits must not be attributed to its runs.
    """
    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    return {"git_commit": git("rev-parse", "HEAD"), "git_src_dirty": bool(git("status", "--porcelain", "--", "src"))}


def run_training(spec: RunSpec, out_dir: Path, threads: int) -> TrainingResult:
    """Train ``spec`` in this process (what ``dpnoise train`` with :func:`train_argv` does)."""
    from dpnoise.training import train_private

    return train_private(train_config(spec, out_dir, threads))


#: Record field <- field of the ``dpnoise train`` summary.
RECORD_FROM_SUMMARY = {
    "accuracy": "test_accuracy", "noise": "noise", "noise_unit": "noise_unit", "clip": "clip",
    "sample_rate": "sample_rate", "params": "params", "steps": "steps", "budget_exhausted": "budget_exhausted",
    "epsilon": "epsilon", "epsilon_by_accountant": "epsilon_by_accountant",
    "sound_by_accountant": "sound_by_accountant", "lr": "lr", "scope": "scope", "train_wall_time_s": "wall_time_s",
}


def build_record(spec: RunSpec, result: Optional[TrainingResult], reason: Optional[str],
                 command: str, wall_time: float, threads: int, code_state: dict[str, Any]) -> dict[str, Any]:
    """The JSON record of a finished run (``result`` None: the target was unreachable).

    ``code_state`` is :func:`git_state` taken when the run started.
    """
    record: dict[str, Any] = {
        **spec.to_dict(),
        "name": spec.name,
        "steps_planned": spec.steps,
        "status": "ok" if result is not None else "unreachable",
        "command": command,
        "wall_time_s": wall_time,
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "torch_threads": threads,
        **code_state,
    }
    if result is None:
        record["reason"] = reason
        return record
    summary = result.summary()
    if summary["planned_steps"] != spec.steps:
        raise PlanMismatchError(f"{spec.name}: dpnoise train planned {summary['planned_steps']} steps, not {spec.steps}")
    record.update({key: summary[source] for key, source in RECORD_FROM_SUMMARY.items()})
    record["kappa_at_0_9"] = summary.get("kappa_at_0.9")  # Dirichlet runs only
    record["grad_sample_mode"] = summary.get("grad_sample_mode")  # None in records made before it was recorded
    record["curve"] = [{"step": e.step, "test_accuracy": e.test_accuracy} for e in result.history.epochs]
    return record


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(record: Path) -> bool:
    """Mark ``record`` as being produced by this process (``<name>.running`` holds our PID).

    False when another live process holds the mark (parallel workers never run a spec twice);
    a mark left by a dead process is taken over.
    """
    mark = record.with_suffix(".running")
    mark.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        holder = mark.read_text().strip()
        if holder.isdigit() and process_alive(int(holder)):
            return False
        mark.unlink(missing_ok=True)
        return claim(record)
    with os.fdopen(fd, "w") as handle:
        handle.write(str(os.getpid()))
    return True


def run_spec(spec: RunSpec, results_dir: Path, work_dir: Path, *, threads: int = DEFAULT_THREADS,
             repo: Path = Path(".")) -> Optional[Path]:
    """Run ``spec`` unless its record exists or another worker runs it; return the record path
    (None when skipped).

    A target below what the calibrator can reach (e.g. under the Dirichlet floor) is recorded
    with ``status = "unreachable"`` and the calibrator's message; it is never silently changed.
    """
    path = record_path(results_dir, spec)
    if path.exists():
        logger.info("skip %s (record exists)", spec.name)
        return None
    if not claim(path):
        logger.info("skip %s (another process is running it)", spec.name)
        return None
    try:
        return produce_record(spec, path, work_dir, threads, repo)
    finally:
        path.with_suffix(".running").unlink(missing_ok=True)


def produce_record(spec: RunSpec, path: Path, work_dir: Path, threads: int, repo: Path) -> Path:
    """Train ``spec`` and write its record to ``path``."""
    out_dir = Path(work_dir) / spec.experiment / spec.name
    command = shlex.join(["dpnoise", "train", *train_argv(spec, out_dir, threads)])
    logger.info("run %s: %s", spec.name, command)
    started, code_state = time.perf_counter(), git_state(repo)
    try:
        result, reason = run_training(spec, out_dir, threads), None
    except UnreachableTargetError as err:
        result, reason = None, str(err)
    write_record(path, build_record(spec, result, reason, command, time.perf_counter() - started, threads, code_state))
    logger.info("wrote %s", path)
    return path


def configure_worker_logging() -> None:
    """Progress lines from pool workers, in the same format as the parent's."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_jobs(threads: int = DEFAULT_THREADS) -> int:
    """Runs to train at the same time so that every usable core is busy: cores // threads, at least 1."""
    return max(1, usable_cores() // threads)


def warm_feature_caches(specs: Iterable[RunSpec], results_dir: Path, work_dir: Path, threads: int) -> int:
    """Compute here, with ``threads`` torch threads, the frozen-encoder features that the unfinished
    runs among ``specs`` will read from the feature cache, once per (dataset, model, limits), so that
    runs started in parallel do not each compute the same features on one thread.  Returns how
    many feature sets were computed or found cached."""
    import torch

    from dpnoise.models import FeatureClassifier
    from dpnoise.training import preparation

    seen, warmed, previous_threads = set(), 0, torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for spec in specs:
            key = (spec.dataset, spec.model, spec.train_limit, spec.test_limit)
            if key in seen or record_path(results_dir, spec).exists():
                continue
            seen.add(key)
            config = train_config(spec, work_dir / spec.experiment / spec.name)
            model = preparation.model_for_dataset(config)
            if isinstance(model, FeatureClassifier):
                logger.info("features of %s on %s (%d threads, cached for the runs)", spec.model, spec.dataset, threads)
                preparation.frozen_features(model, config)
                warmed += 1
    finally:
        torch.set_num_threads(previous_threads)
    return warmed


def run_specs(specs: Iterable[RunSpec], results_dir: Path, work_dir: Path, *,
              threads: int = DEFAULT_THREADS, repo: Path = Path("."), jobs: int = 1) -> list[Path]:
    """Run every spec (skipping finished ones), ``jobs`` at a time in separate processes; return the
    records written now.  Each run uses ``threads`` torch threads, so ``jobs * threads`` should not
    exceed the machine's cores.  With ``jobs`` > 1, frozen-encoder features are computed first, here,
    on all ``jobs * threads`` threads (:func:`warm_feature_caches`)."""
    if jobs < 1:
        raise InvalidParameterError(f"jobs must be >= 1, got {jobs}")
    specs = list(specs)
    if jobs > 1:
        warm_feature_caches(specs, results_dir, work_dir, jobs * threads)
    run = functools.partial(run_spec, results_dir=results_dir, work_dir=work_dir, threads=threads, repo=repo)
    if jobs == 1:
        paths = [run(spec) for spec in specs]
    else:
        # spawn: a fresh interpreter per worker, so torch's thread settings are not inherited by fork
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=configure_worker_logging) as pool:
            paths = list(pool.map(run, specs))
    return [path for path in paths if path is not None]
