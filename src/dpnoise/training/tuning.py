"""Private hyperparameter tuning with sound accounting (Papernot & Steinke, ICLR 2022, arXiv 2110.03620).

The usual report of a DP result gives the epsilon of the winning run, although the runs that chose its
hyperparameters saw the same private data.  :func:`tune_private` accounts for the search:

* the candidates are the configurations of a grid (every combination of the values given per field);
* the number of trials K is drawn from the operating system's entropy, from a Poisson law of mean
  ``trials_mean`` (``trials_shape`` inf) or a truncated negative binomial of that mean and shape; each trial
  trains one candidate drawn uniformly (also from the OS's entropy), to the per-trial epsilon;
* only the best trial is released: its hyperparameters, its score and its model.  The trials run silently
  (their progress lines are dropped), and neither K nor the other trials are released: with K known, the release would be the best of a fixed number of runs, which
  Papernot & Steinke's bounds do not cover (their Sec. 1: a fixed K can cost K times a run);
* the score is the trial's accuracy on the data set's evaluation split, which must be public (a packaged
  data set's test or dev split; a split held out of one's own private file is refused);
* the total epsilon is the RDP bound of releasing the best of K trials (:class:`RepeatAndSelectEvent`;
  Theorems 2 and 6), whose single-trial curve is the pointwise largest of every candidate's RDP curve at
  its calibrated noise, over its planned steps and data releases; the per-trial epsilon is the largest
  whose total meets ``total_epsilon`` (:func:`plan_tuning`, bisection).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from dpnoise.accounting.events import SelfComposedEvent
from dpnoise.accounting.rdp.conversion import epsilon_from_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS
from dpnoise.accounting.rdp.registry import event_rdp
from dpnoise.accounting.rdp.repeat_and_select import repeat_and_select_rdp, truncated_negative_binomial_gamma
from dpnoise.accounting.registry import ACCOUNTANTS, accountants_for_mechanism
from dpnoise.accounting.solvers import UnreachableTargetError
from dpnoise.accounting.validation import InvalidParameterError, check_positive
from dpnoise.training.config import TrainingConfig

#: how close to the total budget the per-trial epsilon is solved (relative)
TOLERANCE = 1e-3


@dataclass(frozen=True, kw_only=True)
class TuningPlan:
    """The per-trial budget of a tuning job and what it gives in total."""

    #: each trial's target epsilon (at the run's delta)
    trial_epsilon: float
    #: the epsilon of releasing the best trial (<= the asked total)
    total_epsilon: float
    delta: float
    trials_mean: float
    trials_shape: float
    #: the candidates' configuration fields (the grid's combinations)
    candidates: tuple[dict[str, Any], ...]
    #: the RDP accountant whose routes gave each trial's curve
    rdp_accountant: str
    #: each candidate's noise (in its mechanism's unit) at the per-trial epsilon: the calibration
    noises: tuple[float, ...] = ()
    #: the fields the grid varies
    grid: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TuningResult:
    """What a tuning job releases: the best trial (None when no trial ran, K = 0) and the accounting."""

    plan: TuningPlan
    #: the best trial's grid fields, score (accuracy on the public evaluation split) and run summary
    best: Optional[dict[str, Any]]
    best_score: Optional[float]
    best_summary: Optional[dict[str, Any]]
    #: where the best trial's outputs are (None: no output folder, or no trial)
    best_folder: Optional[Path]

    def summary(self) -> dict[str, Any]:
        """JSON-able: the released best trial and the accounting (never the number of trials)."""
        plan = self.plan
        return {"total_epsilon": plan.total_epsilon, "delta": plan.delta, "trial_epsilon": plan.trial_epsilon,
                "trials": {"law": trials_law(plan.trials_mean, plan.trials_shape), "mean": plan.trials_mean,
                           "shape": plan.trials_shape},
                "candidates": len(plan.candidates), "rdp_accountant": plan.rdp_accountant,
                "candidate_noise": [{"fields": {path: value for path, value in fields.items() if path in plan.grid},
                                     "noise": noise} for fields, noise in zip(plan.candidates, plan.noises)],
                "best": self.best, "best_score": self.best_score,
                "best_folder": None if self.best_folder is None else str(self.best_folder),
                "released": "the best trial only (its hyperparameters, score and model); neither the number of "
                            "trials nor the other trials"}


def trials_law(mean: float, shape: float) -> str:
    if math.isinf(shape):
        return f"Poisson, mean {mean:g}"
    name = {0.0: "logarithmic", 1.0: "geometric"}.get(shape, f"truncated negative binomial, shape {shape:g}")
    return f"{name}, mean {mean:g}"


def grid_candidates(base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]]) -> tuple[dict[str, Any], ...]:
    """Every combination of ``grid``'s values over ``base``'s configuration fields (dotted paths)."""
    for path, values in grid.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise InvalidParameterError(f"the grid of {path} must be a non-empty list of values, got {values!r}")
    paths = list(grid)
    return tuple({**base, **dict(zip(paths, combination))} for combination in itertools.product(*grid.values()))


def _rdp_accountant(mechanism: str) -> str:
    """The sound RDP accountant of ``mechanism`` whose curve a trial is accounted by."""
    for name in accountants_for_mechanism(mechanism):
        spec = ACCOUNTANTS[name]
        if spec.sound and spec.accountant_kind.takes_rdp_route:
            return name
    raise InvalidParameterError(f"mechanism {mechanism!r} has no sound RDP accountant, which tuning needs")


def trial_curve(fields: Mapping[str, Any], trial_epsilon: float, orders: np.ndarray) -> tuple[np.ndarray, str, float]:
    """The RDP curve at ``orders`` of one trial of the configuration ``fields`` calibrated to ``trial_epsilon``
    (its data releases and planned steps at its calibrated noise), the accountant that gave it, and the noise."""
    from dpnoise.training.preparation import check_against_registries, model_for_dataset
    from dpnoise.training.privacy_plan import resolve
    from dpnoise.data import dataset_info
    from dpnoise.models import count_trainable_parameters

    config = TrainingConfig.from_fields({**fields, "privacy.target_epsilon": trial_epsilon})
    if config.privacy.secure_mode:
        raise InvalidParameterError("tuning in secure mode is not implemented (its discrete steps' correction would "
                                    "have to be applied to each trial)")
    check_against_registries(config)
    train_size = config.data.limit or dataset_info(config.data.name).train_size
    params = _parameter_count(config, model_for_dataset, count_trainable_parameters)
    plan = resolve(config.privacy, sample_rate=config.schedule.batch_size / train_size, params=params,
                   expected_batch_size=config.schedule.batch_size)
    accountant = _rdp_accountant(config.privacy.mechanism)
    route = ACCOUNTANTS[accountant].rdp_route_key
    curve = event_rdp(SelfComposedEvent(plan.step_event, plan.planned_steps), orders, route)
    for release in plan.releases:
        curve = curve + event_rdp(release, orders, route)
    return curve, accountant, plan.setup.noise


_PARAMETERS: dict[tuple, int] = {}


def _parameter_count(config: TrainingConfig, build, count) -> int:
    key = (config.model, config.data.name, config.trainable, config.lora_rank, config.resolution)
    if key not in _PARAMETERS:
        _PARAMETERS[key] = count(build(config))
    return _PARAMETERS[key]


def tuned_epsilon(candidates: Sequence[Mapping[str, Any]], trial_epsilon: float, delta: float, trials_mean: float,
                  trials_shape: float, orders: np.ndarray = DEFAULT_ORDERS) -> tuple[float, str, tuple[float, ...]]:
    """The epsilon at ``delta`` of releasing the best of K trials, each a candidate at ``trial_epsilon``; the RDP
    accountant of the first candidate; each candidate's noise."""
    curves, names, noises = zip(*(trial_curve(fields, trial_epsilon, orders) for fields in candidates))
    tuned = repeat_and_select_rdp(orders, np.max(np.stack(curves), axis=0), trials_mean, trials_shape)
    return epsilon_from_rdp(orders, tuned, delta)[0], names[0], tuple(noises)


def plan_tuning(base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], *, total_epsilon: float,
                trials_mean: float, trials_shape: float = math.inf) -> TuningPlan:
    """The largest per-trial epsilon whose tuning job (best of K trials over the grid's candidates) meets
    ``total_epsilon``, found by bisection on its logarithm (to :data:`TOLERANCE`)."""
    total_epsilon = check_positive("total_epsilon", total_epsilon)
    if isinstance(trials_mean, bool) or not (isinstance(trials_mean, (int, float)) and 1 <= trials_mean < 1e6):
        raise InvalidParameterError(f"trials_mean must be in [1, 1e6), got {trials_mean!r}")
    if math.isnan(trials_shape) or trials_shape < 0:
        raise InvalidParameterError(f"trials_shape must be >= 0 (inf: Poisson), got {trials_shape!r}")
    candidates = grid_candidates(base, grid)
    delta = TrainingConfig.from_fields({**candidates[0], "privacy.target_epsilon": 1.0}).privacy.delta

    def total(trial: float) -> tuple[float, str, tuple[float, ...]]:
        return tuned_epsilon(candidates, trial, delta, trials_mean, trials_shape)

    low, high = total_epsilon * 1e-3, total_epsilon
    while (lowest := _reachable(total, low)) is None:  # below the trials' floor no noise reaches it: start higher
        low *= 2
        if low >= total_epsilon:
            raise InvalidParameterError(f"total_epsilon {total_epsilon} is unreachable: a single trial cannot reach "
                                        f"it at any noise; raise it, or lower the steps or the sample rate")
    if lowest[0] > total_epsilon:
        raise InvalidParameterError(f"total_epsilon {total_epsilon} is unreachable with {trials_mean:g} trials on "
                                    f"average: even trials of epsilon {low:.3g} cost more in total; raise it or use "
                                    f"fewer trials")
    if total(high)[0] <= total_epsilon:  # (only K = 1 exactly)
        low = high
    while high / low > 1 + TOLERANCE:
        middle = math.sqrt(low * high)
        if total(middle)[0] <= total_epsilon:
            low = middle
        else:
            high = middle
    reached, accountant, noises = total(low)
    return TuningPlan(trial_epsilon=low, total_epsilon=reached, delta=delta, trials_mean=float(trials_mean),
                      trials_shape=float(trials_shape), candidates=candidates, rdp_accountant=accountant, noises=noises,
                      grid=tuple(grid))


def _reachable(total: Callable[[float], Any], trial_epsilon: float) -> Any:
    """``total(trial_epsilon)``, or None where a candidate's noise cannot be calibrated to ``trial_epsilon``."""
    try:
        return total(trial_epsilon)
    except UnreachableTargetError:
        return None


def draw_trial_count(mean: float, shape: float, entropy: Optional[int] = None) -> int:
    """K from the tuning law, drawn with the operating system's entropy (``entropy``: a seed, for tests)."""
    rng = np.random.default_rng(secrets.randbits(128) if entropy is None else entropy)
    if math.isinf(shape):
        return int(rng.poisson(mean))
    if mean == 1:  # the truncated negative binomial of mean 1
        return 1
    gamma = truncated_negative_binomial_gamma(shape, mean)
    while True:  # K ~ D_{eta, gamma}: a negative binomial conditioned on K >= 1 (logarithmic at eta = 0)
        k = int(rng.logseries(1 - gamma)) if shape == 0 else int(rng.negative_binomial(shape, gamma))
        if k >= 1:
            return k


def tune_private(base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], *, total_epsilon: float,
                 trials_mean: float, trials_shape: float = math.inf, output_folder: Optional[Path] = None,
                 entropy: Optional[int] = None, state_file: Optional[Path] = None,
                 progress: bool = False) -> TuningResult:
    """Tune the grid's hyperparameters privately (module docstring) and release the best trial.

    ``base``: the configuration fields every trial shares (dotted paths, :meth:`TrainingConfig.from_fields`;
    ``privacy.target_epsilon`` is set per trial); ``grid``: the values tried per field; ``output_folder``:
    where the best trial's outputs go (the other trials' are deleted); ``entropy``: seeds the number of trials
    and the candidates drawn (default: the OS's entropy; a seed makes them known to whoever knows it);
    ``state_file``: where the job keeps its progress (:func:`load_tuning_state`), so that a killed job run again
    with it resumes: the trials done are kept, K is not drawn again, and a finished job releases the same best
    trial again instead of running another search; ``progress``: count the finished trials on standard error.
    """
    from dpnoise.checks import parse_source
    from dpnoise.training.pipeline import train_private

    if parse_source(base.get("data.name")) is not None:
        raise InvalidParameterError("tuning scores each trial on the evaluation split, which must be public; a split "
                                    "held out of your own data file is private (noisy scores are not implemented)")
    plan = plan_tuning(base, grid, total_epsilon=total_epsilon, trials_mean=trials_mean, trials_shape=trials_shape)
    rng = np.random.default_rng(secrets.randbits(128) if entropy is None else entropy + 1)
    state = None if state_file is None else load_tuning_state(Path(state_file), plan)
    if state is None:
        state = {"plan": _fingerprint(plan), "trials": draw_trial_count(trials_mean, trials_shape, entropy), "done": 0,
                 "rng": rng.bit_generator.state, "best": None, "finished": False}
    rng.bit_generator.state = state["rng"]
    work = Path(tempfile.mkdtemp(prefix="dpnoise-tune-")) if state_file is None else Path(f"{state_file}.trials")
    work.mkdir(parents=True, exist_ok=True)
    counter = _trial_counter(state["done"], progress)
    try:
        while state["done"] < state["trials"]:
            fields = plan.candidates[int(rng.integers(len(plan.candidates)))]
            folder = work / f"trial-{state['done']}" if output_folder is not None else None
            if folder is not None and folder.exists():  # a trial a killed job did not finish: run it again
                shutil.rmtree(folder)
            config = TrainingConfig.from_fields({**fields, "privacy.target_epsilon": plan.trial_epsilon,
                                                 "output.progress": False,
                                                 **({"output.folder": folder} if folder else {})})
            with contextlib.redirect_stderr(io.StringIO()):  # a trial's progress and scores are not released
                result = train_private(config)
            score = -math.inf if result.test_accuracy is None else result.test_accuracy
            if state["best"] is None or score > state["best"]["score"]:
                state["best"] = {"score": score, "fields": {path: fields[path] for path in grid},
                                 "summary": result.summary(), "folder": None if folder is None else str(folder)}
            state.update(done=state["done"] + 1, rng=rng.bit_generator.state)
            _save_tuning_state(state_file, state)
            counter.update()
        best_folder = _release_best_folder(state, output_folder)
        _save_tuning_state(state_file, state)
    finally:
        counter.close()
        if state_file is None or state["finished"]:
            shutil.rmtree(work, ignore_errors=True)
    best = state["best"]
    if best is None:
        return TuningResult(plan=plan, best=None, best_score=None, best_summary=None, best_folder=None)
    return TuningResult(plan=plan, best=best["fields"], best_score=best["score"], best_summary=best["summary"],
                        best_folder=best_folder)


def load_tuning_state(path: Path, plan: TuningPlan) -> Optional[dict[str, Any]]:
    """The saved progress of the tuning job ``plan`` (None: no file yet).  The file holds the secret number of
    trials K, the trials done, the candidate draws' generator state and the best trial so far: keep it as
    private as the training data.  A file of another job (other candidates, epsilons or law of K) is refused."""
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InvalidParameterError(f"state_file {path}: not a tuning state ({err})") from None
    if not isinstance(state, dict) or state.get("plan") != _fingerprint(plan):
        raise InvalidParameterError(f"state_file {path} is another tuning job's (its candidates, epsilons or law of "
                                    f"the number of trials differ): give a new file, or this job's options")
    return state


def _fingerprint(plan: TuningPlan) -> dict[str, Any]:
    """What identifies a tuning job, as JSON reads it back."""
    return json.loads(json.dumps({"candidates": plan.candidates, "trial_epsilon": plan.trial_epsilon,
                                  "total_epsilon": plan.total_epsilon, "delta": plan.delta,
                                  "trials_mean": plan.trials_mean, "trials_shape": plan.trials_shape}, default=str))


def _save_tuning_state(path: Optional[Path], state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` at once (a file replaced whole: a kill leaves the old state or the new)."""
    if path is None:
        return
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(state, default=str))
    os.replace(partial, path)


def _release_best_folder(state: dict[str, Any], output_folder: Optional[Path]) -> Optional[Path]:
    """Copy the best trial's outputs to ``output_folder`` once (a finished job's copy is kept); mark the job
    finished; the folder released (None: no output folder, or no trial)."""
    best = state["best"]
    if output_folder is None or best is None or best["folder"] is None:
        state["finished"] = True
        return None
    output_folder = Path(output_folder)
    if not state["finished"]:
        if output_folder.exists():
            shutil.rmtree(output_folder)
        shutil.copytree(best["folder"], output_folder)
        state["finished"] = True
    return output_folder


def _trial_counter(done: int, shown: bool) -> Any:
    """A count of the finished trials on standard error (the job's operator sees it; nothing released shows it)."""
    from tqdm import tqdm

    return tqdm(initial=done, desc="tuning", unit="trial", disable=not shown)


__all__ = ["TuningPlan", "TuningResult", "draw_trial_count", "grid_candidates", "load_tuning_state", "plan_tuning",
           "trial_curve",
           "trials_law", "tune_private", "tuned_epsilon"]
