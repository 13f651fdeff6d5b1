"""An engine's checkpoint state as plain data: how it is captured, what a resumed run must agree with, and
the forms older checkpoints wrote.

:func:`capture_engine_state` writes the state (run identity, setup, seeds, step counter, budget flag,
accountant states and, with a ``noise_seed``, every rank's generator states with their tags; secret
randomness is never saved).

:func:`check_engine_state` takes the saved state and the facts of the run resuming it (:class:`ResumingRun`:
its setup, seed, private randomness, budget, accountants, data releases, step event, process count and
device) and refuses, naming the field, anything that is not a consistent state of that run; it needs no
model, optimizer or engine, so every rule is testable on dictionaries
(:meth:`~dpnoise.training.engine.PrivacyEngine.load_state_dict` lists the rules).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from dpnoise.accounting import InvalidParameterError, accountant_holding, get_accountant, get_mechanism_spec
from dpnoise.accounting.events import DiscreteGaussianStepEvent, DpEvent, PoissonSampledEvent, event_to_dict
from dpnoise.training.errors import CheckpointMismatchError
from dpnoise.training.privacy_plan import ADAPTIVE_OPTIONS, PrivacySetup
from dpnoise.training.randomness import generator_state_tag
from dpnoise.training.step_ledger import StepLedger


@dataclass(frozen=True)
class ResumingRun:
    """What a saved engine state must agree with: the run that resumes it."""

    setup: PrivacySetup
    seed: Any
    private_randomness: str
    #: the most steps within the target budget (None: no target)
    max_steps: Optional[int]
    #: the names of the run's accountants
    accountants: tuple[str, ...]
    data_releases: Sequence[DpEvent]
    step_event: DpEvent
    world_size: int
    noise_seed: Optional[int]
    device: torch.device


def capture_engine_state(run: ResumingRun, run_id: str, ledger: StepLedger, generator_ranks: list[dict]) -> dict:
    """The engine state of ``run`` (plain, JSON-able data but the generators' byte tensors) after the steps of
    ``ledger``; ``generator_ranks`` holds every rank's saved generators (empty dictionaries when secret)."""
    return {
        "run_id": run_id,
        "setup": asdict(run.setup),
        "seed": run.seed,
        "private_randomness": run.private_randomness,
        "steps": ledger.steps,
        "budget_exhausted": ledger.budget_exhausted,
        "accountants": {name: accountant.state_dict() for name, accountant in ledger.accountants.items()},
        "generators": {"device": run.device.type, "ranks": generator_ranks},
    }


def check_engine_state(state: Any, run: ResumingRun) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``state`` is a consistent engine state of the run ``run``
    describes (what :meth:`~dpnoise.training.engine.PrivacyEngine.load_state_dict` restores).

    The state is refused (one line naming the field) unless:

    * its privacy setup equals the run's, field by field, and so does its seed;
    * its step counter k is an integer with 0 <= k <= ``max_steps`` (when there is a budget),
      and ``budget_exhausted`` is set only once k reached ``max_steps``;
    * it holds exactly the run's accountants, and the state of each one equals the state of a fresh
      accountant of that name holding the run's data releases (``accountant_holding``, as in
      ``make_private``) after ``compose(step_event, k)``: a ledger cannot be shortened, emptied or
      recorded with other noise without contradicting the step counter or the setup;
    * it holds the generators of as many ranks as this run has (resume with the same K);
    * its private randomness is this run's: secret (no generator state saved; the resumed run
      draws fresh secret seeds) or from the same ``noise_seed``, every saved generator state
      carrying the tag that binds it to that seed (a replaced state is refused).

    The ledger check assumes that k single steps leave an accountant in the same state as one
    ``compose(step_event, k)`` (true of every registered accountant: consecutive equal events
    are merged; the accountant contract test checks it for each).
    """

    def differs(field: str, saved: Any, current: Any) -> CheckpointMismatchError:
        return CheckpointMismatchError(
            f"checkpoint differs from this run in {field}: {_describe(saved)} (checkpoint) vs {_describe(current)} (this run)"
        )

    def inconsistent(field: str, problem: str) -> CheckpointMismatchError:
        return CheckpointMismatchError(f"checkpoint is inconsistent in {field}: {problem}")

    if not isinstance(state, dict):
        raise inconsistent("engine state", f"a {type(state).__name__}, not a dictionary")
    state = with_discrete_steps(state, run)
    missing = [key for key in ("run_id", "setup", "seed", "private_randomness", "steps", "budget_exhausted",
                               "accountants", "generators") if key not in state]
    if missing:
        raise inconsistent("engine state", f"no {', '.join(missing)}")
    if not isinstance(state["run_id"], str) or not state["run_id"]:
        raise inconsistent("run_id", f"{state['run_id']!r} is not a run identity (a non-empty string)")
    saved_setup, current_setup = state["setup"], asdict(run.setup)
    if not isinstance(saved_setup, dict):
        raise inconsistent("setup", f"a {type(saved_setup).__name__}, not a dictionary")
    # written before data releases, secure mode or mechanism options existed: none, off, the old fields'
    saved_setup = {"data_releases": (), "secure_mode": False, "clipping": "flat", "clipping_gamma": None,
                   "privacy_units": None, **dict.fromkeys(ADAPTIVE_OPTIONS), **_with_options(saved_setup)}
    for field in [*current_setup, *(key for key in saved_setup if key not in current_setup)]:
        saved, current = saved_setup.get(field, _MISSING), current_setup.get(field, _MISSING)
        if _normalized(saved) != _normalized(current):
            raise differs(field, saved, current)
    if state["seed"] != run.seed:
        raise differs("seed", state["seed"], run.seed)
    if state["private_randomness"] != run.private_randomness:
        raise differs("private randomness", state["private_randomness"], run.private_randomness)

    if run.setup.clipping == "adaptive":  # without C_t the resumed run would clip elsewhere than the saved one
        clip = state.get("adaptive_clip")
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0:
            raise inconsistent("adaptive_clip", "adaptive clipping's threshold C_t is missing or not a positive "
                                                f"number ({clip!r})")
    steps = state["steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise inconsistent("steps", f"{steps!r} is not a step count (an integer >= 0)")
    if run.max_steps is not None and steps > run.max_steps:
        raise inconsistent("steps", f"{steps} steps taken, but the budget epsilon={run.setup.target_epsilon} "
                                    f"(delta={run.setup.delta}) allows at most {run.max_steps}")
    exhausted = state["budget_exhausted"]
    if not isinstance(exhausted, bool):
        raise inconsistent("budget_exhausted", f"{exhausted!r} is not True or False")
    if exhausted and (run.max_steps is None or steps < run.max_steps):
        allowed = "no budget" if run.max_steps is None else f"a budget of {run.max_steps} steps"
        raise inconsistent("budget_exhausted", f"set after {steps} steps with {allowed}")

    saved_accountants = state["accountants"]
    if not isinstance(saved_accountants, dict):
        raise inconsistent("accountants", f"a {type(saved_accountants).__name__}, not a dictionary")
    if set(saved_accountants) != set(run.accountants):
        raise differs("accountants", tuple(saved_accountants), tuple(run.accountants))
    for name in run.accountants:
        expected = accountant_holding(name, run.data_releases).compose(run.step_event, steps)
        if not _same_state(saved_accountants[name], expected.state_dict()):
            recorded = _ledger_steps(name, saved_accountants[name])
            if recorded is not None and recorded != steps:
                raise inconsistent(f"accountant {name!r}", f"its ledger records {recorded} steps, "
                                                          f"but the step counter says {steps}")
            raise inconsistent(f"accountant {name!r}", f"its ledger is not {steps} steps of this run's "
                                                      f"privacy setup ({_describe_event(run.step_event)})")
    generators = state["generators"]
    if not isinstance(generators, dict) or generators.get("device") not in ("cpu", "cuda") \
            or not isinstance(generators.get("ranks"), list):
        raise inconsistent("generators", "not a device and a list of ranks' generator states")
    if len(generators["ranks"]) != run.world_size:
        raise differs("number of processes", len(generators["ranks"]), run.world_size)
    for rank, own in enumerate(generators["ranks"]):
        if not isinstance(own, dict):
            raise inconsistent(f"rank {rank}'s generators", "not a dictionary")
        if run.noise_seed is None:
            if own:
                raise inconsistent(f"rank {rank}'s generators", "generator states saved by a run whose private "
                                                                "randomness is secret (none should be)")
            continue
        for name in ("noise", "sampling"):
            problem = _generator_state_problem(own.get(name), generators["device"], run.device)
            if problem:
                raise inconsistent(f"rank {rank}'s {name} generator", problem)
            if own.get(f"{name}_tag") != generator_state_tag(run.noise_seed, rank, name, own[name]):
                raise CheckpointMismatchError(
                    f"checkpoint differs from this run in noise_seed, or its rank {rank} {name} generator was "
                    f"replaced or edited: its state does not carry this run's noise-seed tag (resume with the "
                    f"noise_seed it was written with)")


def with_discrete_steps(state: Any, run: ResumingRun) -> Any:
    """``state`` with the ledgers of a secure Gaussian run written before its steps were recorded as
    :class:`~dpnoise.accounting.events.DiscreteGaussianStepEvent` s (they hold the continuous step, whose
    epsilon the engine then corrected) rewritten as this run's ledgers: an accountant's saved state is
    replaced only where it equals, exactly, the old form of this run's ledger after the saved step count."""
    step_event, steps = run.step_event, state.get("steps") if isinstance(state, dict) else None
    if not isinstance(step_event, DiscreteGaussianStepEvent) or not isinstance(state.get("accountants"), dict) \
            or not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        return state
    upgraded = {}
    for name, saved in state["accountants"].items():
        if name in run.accountants and _same_state(saved, accountant_holding(name, run.data_releases).compose(
                step_event.event, steps).state_dict()):
            saved = accountant_holding(name, run.data_releases).compose(step_event, steps).state_dict()
        upgraded[name] = saved
    return {**state, "accountants": upgraded}


_MISSING = type("Missing", (), {"__repr__": lambda self: "missing"})()


def _generator_state_problem(saved: Any, saved_device: str, device: torch.device) -> Optional[str]:
    """Why ``saved`` cannot be a generator state of ``saved_device`` (None when it can be).

    A state of this run's kind of device is tried on a generator there; another device's state
    (which will not be restored) must be a byte tensor.
    """
    if not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8:
        return "not a generator state (a byte tensor)"
    if saved_device != device.type:
        return None
    try:
        torch.Generator(device=device).set_state(saved)
    except (RuntimeError, TypeError) as err:
        return f"not a generator state ({str(err).splitlines()[0]})"
    return None


def _normalized(value: Any) -> Any:
    """``value`` with lists as tuples (a saved tuple may come back as a list)."""
    if isinstance(value, (list, tuple)):
        return tuple(_normalized(v) for v in value)
    return value


def _describe(value: Any) -> str:
    """A short, one-line rendering of a setup value for error messages."""
    if value is _MISSING:
        return "missing"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_describe(v) for v in value) or "none"
    if isinstance(value, str):
        return value
    return repr(value)


def _with_options(saved_setup: dict[str, Any]) -> dict[str, Any]:
    """A saved setup with its mechanism's options as one ``options`` entry: a setup written before options
    existed held the Dirichlet ``alpha`` (None for other mechanisms) and ``num_classes`` as fields."""
    if "options" in saved_setup or "alpha" not in saved_setup:
        return saved_setup
    setup = dict(saved_setup)
    legacy = {name: setup.pop(name, None) for name in ("alpha", "num_classes")}
    try:
        options = get_mechanism_spec(setup.get("mechanism")).make_options(**legacy)
    except InvalidParameterError:
        return saved_setup  # reported as it differs, field by field
    return {**setup, "options": options.to_dict()}


def _describe_event(event: DpEvent) -> str:
    """A DP event on one line, e.g. ``GaussianEvent noise_multiplier 1.1 sampled at 0.01``."""
    if isinstance(event, PoissonSampledEvent):
        return f"{_describe_event(event.event)} sampled at {event.sampling_probability:g}"
    if isinstance(event, DiscreteGaussianStepEvent):
        return f"{_describe_event(event.event)}, released as a discrete Gaussian on {event.coordinates} coordinates"
    described = event_to_dict(event)
    return " ".join([described.pop("type"), *(f"{key} {value}" for key, value in described.items())])


def _same_state(a: Any, b: Any) -> bool:
    """Exact equality of two state dictionaries (nested dicts, lists, tuples, arrays, tensors, numbers)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape \
            and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return bool(a == b)


def _ledger_steps(name: str, state: Any) -> Optional[int]:
    """Steps recorded in a saved accountant state (None when it cannot be read)."""
    try:
        accountant = get_accountant(name)
        accountant.load_state_dict(state)
        return int(accountant.steps)
    except Exception:  # noqa: BLE001  (a malformed state simply has no readable step count)
        return None


__all__ = ["ResumingRun", "capture_engine_state", "check_engine_state", "with_discrete_steps"]
