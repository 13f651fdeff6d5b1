"""``accelerator.prepare(module, optimizer, loader)`` on dpnoise's private objects, in one process and in 2 gloo
processes started as ``torchrun`` would (``accelerate_worker.py``, one launch for the module).

The update of every step is compared with the exact one computed here by plain autograd: each example's
gradient clipped to C, the clipped gradients of the union of the ranks' Poisson batches summed, divided by
the expected batch size B (noise switched off through the test hook ``release_sums.noise_of``); the epsilon
with one process's after the same steps.  What accelerate would add and dpnoise does not do is refused at
``prepare()``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

import accelerate_worker as workers  # noqa: E402
from dpnoise.training.accelerate_setup import check_accelerate_setup  # noqa: E402
from dpnoise.training.errors import InvalidTrainingOptionError  # noqa: E402
from training_helpers import exact_clipped_sgd, finish, launch, union_steps  # noqa: E402

WORKER = Path(__file__).with_name("accelerate_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the 2 ranks saw."""
    out = tmp_path_factory.mktemp("accelerate")
    for code, _, err in finish(launch([str(WORKER), str(out)]), timeout=170):
        assert code == 0, err[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture
def fresh_accelerate():
    """accelerate's process-wide state reset before and after (an Accelerator's settings cannot change)."""
    def reset() -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    reset()
    yield accelerate.Accelerator
    reset()


def example_loss(model: torch.nn.Module, i: int) -> torch.Tensor:
    inputs, targets = workers.dataset().tensors
    return F.cross_entropy(model(inputs[i:i + 1]), targets[i:i + 1])


def assert_exact(params: dict[str, torch.Tensor], steps: list[list[int]]) -> None:
    exact = exact_clipped_sgd(workers.tiny_model(), example_loss, steps, workers.CLIP, workers.LR, workers.BATCH)
    for name, expected in exact.items():
        torch.testing.assert_close(params[name], expected, rtol=1e-5, atol=1e-6, msg=name)


def one_process_epsilon(steps: int) -> float:
    """The epsilon of one process's engine with the workers' options after ``steps`` steps."""
    _, optimizer, _ = workers.private(1.0)
    for _ in range(steps):
        optimizer.privacy_engine.record_step()
    return optimizer.privacy_engine.get_epsilon()


# ------------------------------------------------------------------------------------------ one process
def test_one_process_takes_the_exact_steps_in_physical_batches(fresh_accelerate):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = workers.prepared_run(fresh_accelerate(cpu=True), 0.0)
    steps = union_steps(run["draws"])
    assert run["steps"] == workers.STEPS == len(steps)
    assert len(run["draws"]) > workers.STEPS  # pieces of at most PHYSICAL examples, accumulated into each step
    assert all(len(indices) <= workers.PHYSICAL for _, indices in run["draws"])
    assert run["prepared"] == ("BookkeepingModule", "DeviceDataLoader", "AcceleratedOptimizer")
    assert_exact(run["params"], steps)
    assert run["epsilon"] == one_process_epsilon(workers.STEPS)


@pytest.mark.parametrize("setting, message", [
    (dict(mixed_precision="bf16"), r"Accelerator\(mixed_precision='bf16'\) is not applied"),
    (dict(gradient_accumulation_steps=2), r"Accelerator\(gradient_accumulation_steps=2\) would make one optimizer "
                                          r"step of 2 Poisson batches"),
])
def test_what_accelerate_would_add_is_refused_at_prepare(fresh_accelerate, setting, message):
    module, optimizer, loader = workers.private(1.0)
    accelerator = fresh_accelerate(cpu=True, **setting)
    for private in (module, loader):
        with pytest.raises(InvalidTrainingOptionError, match=message):
            accelerator.prepare(private)
    assert optimizer.privacy_engine.steps == 0


def test_another_device_or_number_of_processes_is_refused(fresh_accelerate):
    fresh_accelerate(cpu=True)
    with pytest.raises(InvalidTrainingOptionError, match=r"live on cuda:0 but accelerator.device is cpu: call "
                                                         r"make_private\(\.\.\., device=accelerator.device\)"):
        check_accelerate_setup(torch.device("cuda", 0), 1)
    with pytest.raises(InvalidTrainingOptionError, match=r"made in a run of 2 process\(es\) but accelerate runs 1"):
        check_accelerate_setup(torch.device("cpu"), 2)


def test_outside_an_accelerator_nothing_is_checked(fresh_accelerate):
    module, _, loader = workers.private(1.0)
    assert module._is_accelerate_prepared and loader._is_accelerate_prepared


# ------------------------------------------------------------------------------------------ 2 ranks
def test_two_ranks_take_the_exact_steps_of_the_union_batches(ranks):
    first, second = (rank["noiseless"] for rank in ranks)
    assert first["steps"] == second["steps"] == workers.STEPS
    assert all(i % 2 == 0 for _, indices in first["draws"] for i in indices)  # each rank draws its own shard
    assert all(i % 2 == 1 for _, indices in second["draws"] for i in indices)
    steps = union_steps(first["draws"], second["draws"])
    assert len(steps) == workers.STEPS
    for name, value in first["params"].items():
        assert torch.equal(value, second["params"][name]), f"{name}: the ranks hold different models"
    assert_exact(first["params"], steps)


def test_two_ranks_have_the_one_process_epsilon(ranks):
    first, second = (rank["noisy"] for rank in ranks)
    assert first["steps"] == second["steps"] == workers.STEPS
    assert first["epsilon"] == second["epsilon"] == one_process_epsilon(workers.STEPS)
    for name, value in first["params"].items():
        assert torch.equal(value, second["params"][name]) and torch.isfinite(value).all(), name
    assert first["prepared"] == ("BookkeepingModule", "DeviceDataLoader", "AcceleratedOptimizer")  # no DDP


def test_private_objects_made_before_the_accelerator_are_refused(ranks):
    for rank in ranks:
        assert rank["early"].startswith(
            "InvalidTrainingOptionError: accelerator.prepare() on dpnoise's private objects: the private objects were "
            "made in a run of 1 process(es) but accelerate runs 2: create the Accelerator (it starts the process "
            "group) before calling make_private")
