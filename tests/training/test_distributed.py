"""Distributed training on the CPU with gloo and 2 processes, and the device-aware engine.

The library scenarios run once in 2 worker processes (``distributed_workers.py``, one launch for the
module) and are compared here with one process: the all-reduced clipped sum is the one-process
clipped sum of the union batch (noise switched off through ``optimizer.noisy_sum.release_sums.noise_of``), the ranks'
noise shares sum to the mechanism's noise, a missing share / a skipped step / another setup stops
every rank, and the budget stops every rank at the same step.  ``dpnoise train`` runs under
``torchrun`` and with a rank killed.  CUDA tests skip without a GPU.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch.nn import functional as F

from dpnoise.accounting import UnsoundAccountantWarning, noise_keywords
from dpnoise.errors import DpnoiseError, ProcessGroupLostError
from dpnoise.mechanisms import gaussian_noise, laplace_noise
from dpnoise.training import (
    CheckpointMismatchError,
    DataConfig,
    ExecutionOptions,
    InvalidConfigError,
    InvalidTrainingOptionError,
    OptimizerConfig,
    OutputConfig,
    PrivacyOptions,
    Schedule,
    TrainingConfig,
    endless_batches,
    load_checkpoint,
    make_private,
    save_checkpoint,
    train_private,
    train_step,
    train_steps,
)
from dpnoise.training.checkpoint import read_checkpoint, write_checkpoint_state
from dpnoise.training.distributed import (
    DistributedError,
    RankGroup,
    RankLostError,
    count_digits,
    digits_count,
    generator_seeds,
)

from dpnoise.training.sampling import LogicalBatchTracker

import distributed_workers as workers
from training_helpers import digits_loader, finish, launch, mlp

WORKERS = Path(__file__).with_name("distributed_workers.py")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


#: ``dpnoise train`` for the interrupted (2 ranks) and resumed runs (2 ranks under torchrun, and 1 rank)
TRAIN_ARGV = ["--dataset", "digits", "--mechanism", "gaussian", "--noise", "1", "--delta", "1e-5", "--epochs", "5",
              "--batch-size", "64", "--lr", "1e-2", "--noise-seed", "0", "--threads", "1", "--no-progress", "--json"]
#: the resumed runs stop here (the interrupted one is killed after its first epoch, 23 steps)
MAX_STEPS = 60


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """The 2 worker ranks: what each saw in the library scenarios; then their ``dpnoise train`` run, in which
    rank 1 is killed as soon as the first checkpoint is written, and what rank 0 did then."""
    out = tmp_path_factory.mktemp("ranks")
    checkpoint = out / "run" / "checkpoint.pt"
    survivor, victim = launch([str(WORKERS), str(out), *TRAIN_ARGV, "--out", str(out / "run")])
    deadline = time.monotonic() + 120
    while not checkpoint.exists():
        assert survivor.poll() is None and victim.poll() is None and time.monotonic() < deadline, \
            (survivor.poll(), victim.poll(), "no checkpoint was written")
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    (code, _, err), _ = finish([survivor, victim], timeout=60)
    return dict(ranks=[torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)],
                survivor=(code, err, time.monotonic() - killed_at), checkpoint=checkpoint)


@pytest.fixture(scope="module")
def ranks(launched) -> list[dict]:
    return launched["ranks"]


def one_process(mechanism: str, grad_sample_mode: str = "auto", **options):
    """``workers.private`` in this process (no process group), fed by hand as the workers' scenarios are."""
    model = mlp(hidden=16, seed=0)
    noise = noise_keywords(mechanism, options.pop("noise", workers.GRADIENT_MECHANISMS.get(mechanism)))
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(workers.TRAIN, 64), mechanism=mechanism,
        delta=1e-5, max_grad_norm=1.0, seed=0, grad_sample_mode=grad_sample_mode, **noise, **options)
    optimizer.logical_batches = LogicalBatchTracker()
    return module, optimizer, loader


@pytest.fixture(autouse=True)
def _digits_for_workers(digits_train, monkeypatch):
    monkeypatch.setattr(workers, "TRAIN", digits_train, raising=False)


# ------------------------------------------------------------------------------------------ 2 ranks, library
@pytest.mark.parametrize("mechanism", sorted(workers.GRADIENT_MECHANISMS))
def test_all_reduced_clipped_sum_is_the_one_process_clipped_sum_of_the_union_batch(ranks, digits_train, mechanism):
    x, y = digits_train.tensors[0][:workers.UNION], digits_train.tensors[1][:workers.UNION]
    for source in ("bookkeeping", "hooks"):
        module, optimizer, _ = one_process(mechanism, source)
        optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
        train_step(module, optimizer, (x, y), F.cross_entropy)
        for split in workers.SPLITS:
            first, second = (rank["clipped_sums"][mechanism, source, split] for rank in ranks)
            for g0, g1, expected in zip(first, second, optimizer.params):
                assert torch.equal(g0, g1), f"{source}, {split}: the ranks apply different updates"
                torch.testing.assert_close(g0, expected.grad, rtol=1e-5, atol=1e-7, msg=f"{source}, {split}")
            assert any(g.abs().sum() > 0 for g in first)


def test_the_ranks_noise_shares_sum_to_the_mechanisms_noise(ranks):
    laplace = [rank["shares"]["lap2"].numpy() for rank in ranks]
    summed = laplace[0] + laplace[1]
    assert not np.array_equal(laplace[0], laplace[1]), "identically seeded ranks"
    assert stats.kstest(summed, stats.laplace(scale=1.0).cdf).pvalue > 1e-3
    assert stats.kstest(laplace[0], stats.laplace(scale=1.0).cdf).pvalue < 1e-6  # one share is not the noise
    for t in (3.0, 6.0, 9.0):  # P(|Lap(1)| > t) = exp(-t)
        expected = len(summed) * math.exp(-t)
        assert abs(np.sum(np.abs(summed) > t) - expected) < 5 * math.sqrt(expected) + 1, t
    gaussian = [rank["shares"]["gaussian"].numpy() for rank in ranks]
    n = len(gaussian[0])
    for share in gaussian:  # N(0, sigma^2 C^2 / K), sigma = C = 1, K = 2
        assert abs(share.var() - 0.5) < 5 * 0.5 * math.sqrt(2 / n)
    assert abs((gaussian[0] + gaussian[1]).var() - 1.0) < 5 * math.sqrt(2 / n)


def test_a_missing_share_a_skipped_step_or_another_setup_stops_every_rank(ranks):
    """Also when the ranks disagree at the budget's last step, under either budget policy."""
    for rank in ranks:
        messages = rank["refusals"]
        assert "1 noise shares were added to this step, 2 expected" in messages["missing share"]
        assert "update is refused" in messages["missing share"]
        for name in ("step count", "step count, output mechanism"):
            assert messages[name] == "ranks disagree on the step count: rank 0 has 0, rank 1 has 1", name
            assert not messages[name + " applied"], f"{name}: the refused update was applied"
        assert messages["setup"].startswith("ranks disagree on the privacy setup: noise is")
        for policy in ("stop", "raise"):  # the rank that refuses joins the step's all-reduce: no hang
            assert messages[f"budget boundary, {policy}"].startswith("ranks disagree on the step count: rank 0 has ")


def test_a_per_example_check_failing_on_one_rank_refuses_the_first_step_on_every_rank(ranks):
    first, second = (rank["check"] for rank in ranks)
    assert first["message"].startswith("per-example gradient check failed (exactness vs. one-example autograd)")
    assert second["message"] == ("the per-example check failed on 1 other rank(s) (their error names the parameter); "
                                 "nothing was noised or accounted")
    assert first["steps"] == second["steps"] == 0 and not first["moved"] and not second["moved"]


@pytest.mark.parametrize("mechanism", sorted(workers.BUDGET))
def test_the_budget_stops_every_rank_at_the_same_step_with_the_one_process_epsilon(ranks, mechanism):
    first, second = (rank["budget"][mechanism] for rank in ranks)
    _, optimizer, _ = one_process(mechanism, on_budget_exhausted="stop", **workers.BUDGET[mechanism])
    engine = optimizer.privacy_engine
    assert first["steps"] == second["steps"] == first["max_steps"] == engine.max_steps < 200
    assert first["exhausted"] and second["exhausted"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        for _ in range(first["steps"]):
            engine.record_step()
    assert first["epsilon"] == second["epsilon"] == engine.get_epsilon() <= workers.BUDGET[mechanism]["target_epsilon"]
    for p0, p1 in zip(first["params"], second["params"]):
        assert torch.equal(p0, p1), "the ranks' models drifted apart"


def test_ranks_that_give_no_seed_take_rank_0s_public_seed(ranks):
    first, second = (rank["public_seed"]["seed"] for rank in ranks)
    assert first == second


# ------------------------------------------------------------------------------------------ 2 ranks, dpnoise train
def test_a_killed_rank_makes_the_other_exit_with_a_clear_error_and_the_checkpoint_stays_intact(launched):
    code, err, seconds = launched["survivor"]
    assert code == 2 and seconds < 60, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("dpnoise train: error: rank 0 of 2: ")
    assert "another rank died or stalled" in err and f"the last checkpoint, {launched['checkpoint']}, is intact" in err
    assert 0 < read_checkpoint(launched["checkpoint"])["engine"]["steps"] < MAX_STEPS  # written after an epoch


def test_the_run_resumes_under_torchrun_with_the_epsilon_and_accuracy_of_one_process(launched):
    resumed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "dpnoise",
         "train", *TRAIN_ARGV, "--resume", str(launched["checkpoint"]), "--max-steps", str(MAX_STEPS)],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    two_ranks = json.loads(resumed.stdout)  # one report: rank 0's
    one_rank = train_private(TrainingConfig(
        data=DataConfig("digits"), privacy=PrivacyOptions(mechanism="gaussian", noise=1.0, delta=1e-5, epochs=5),
        schedule=Schedule(batch_size=64, max_steps=MAX_STEPS), optimizer=OptimizerConfig(lr=1e-2),
        output=OutputConfig(progress=False), noise_seed=0, threads=1)).summary()
    assert two_ranks["processes"] == 2 and one_rank["processes"] == 1
    for key in ("steps", "sample_rate", "noise", "epsilon_by_accountant"):
        assert two_ranks[key] == one_rank[key], key
    assert two_ranks["steps"] == MAX_STEPS
    assert min(two_ranks["test_accuracy"], one_rank["test_accuracy"]) > 0.5
    assert abs(two_ranks["test_accuracy"] - one_rank["test_accuracy"]) < 0.15


# ------------------------------------------------------------------------------------------ one process
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_values_checked_across_ranks_survive_their_sum_exactly_in_every_dtype(dtype):
    """A checked value travels in its base-256 digits beside zeros from the other ranks: every digit and
    every sum with zeros is exact, also where the value itself is not (2^24 + 1 in float32)."""
    for value in (0, 1, 255, 256, 2 ** 24 + 1, 10 ** 12 + 7, 2 ** 64 - 1):
        digits = count_digits(value, dtype, torch.device("cpu"))
        summed = digits + torch.zeros_like(digits)
        assert digits.dtype == dtype and digits_count(summed.tolist()) == value
    for bad in (-1, 2 ** 64):
        with pytest.raises(ValueError, match="checked across ranks"):
            count_digits(bad, dtype, torch.device("cpu"))


class FailingWork:
    """What ``dist.all_reduce(..., async_op=True)`` returns when a peer closed its connection: its wait fails."""

    def wait(self) -> None:
        raise RuntimeError("[pair.cc:537] Read error [127.0.0.1]:19879: Connection reset by peer\nmore")


def test_a_failed_collective_becomes_a_rank_lost_error_naming_it():
    with pytest.raises(RankLostError, match=r"^rank 1 of 2: summing failed: another rank died or stalled .*"
                                            r"\(\[pair.cc:537\] Read error .* peer\)$") as raised:
        RankGroup(rank=1, world_size=2, device=torch.device("cpu"))._collective("summing", lambda async_op: FailingWork())
    assert isinstance(raised.value, DistributedError) and isinstance(raised.value, ProcessGroupLostError)


def test_a_ranks_own_error_issuing_a_collective_is_raised_as_itself():
    """An error raised before the collective reaches the other ranks (what broadcasting a DTensor raised) is this
    rank's: it keeps its type and text, with a note naming the rank, instead of blaming another rank."""
    def refuse(async_op):
        raise NotImplementedError("Operator c10d.broadcast_.default does not have a sharding strategy registered.")

    with pytest.raises(NotImplementedError, match="^Operator c10d.broadcast_.default does not have") as raised:
        RankGroup(rank=1, world_size=2, device=torch.device("cpu"))._collective("broadcasting", refuse)
    assert raised.value.__notes__ == ["rank 1 of 2: raised by this rank while broadcasting"]


def test_every_rank_and_role_gets_its_own_seed():
    assert generator_seeds(7) == (7, 8, 9)  # one process: as before
    seeds = [s for k in range(2, 9) for r in range(k) for s in generator_seeds(7, r, k)]
    seeds += [s for r in range(2) for s in generator_seeds(7, r, 2, resumed_at=23)]
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "dirichlet"])
def test_a_float64_model_trains_on_the_cpu(digits_train, mechanism):
    model = mlp(hidden=16).double()
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(digits_train, 64), mechanism=mechanism,
        delta=1e-5, **noise_keywords(mechanism, 1.0), device="cpu", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    inputs, _ = next(iter(loader))
    assert inputs.dtype == torch.float64 and optimizer.privacy_engine.noise_generator.device.type == "cpu"
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 3)
    for old, new in zip(before, model.parameters()):
        assert new.dtype == torch.float64 and torch.isfinite(new).all() and not torch.equal(old, new)


def resumable_run(digits_train):
    model = mlp(hidden=16)
    return make_private(model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(digits_train, 64),
                        mechanism="lap2", laplace_scale=1.0, delta=1e-5, seed=0, noise_seed=0)


def test_a_checkpoint_from_another_device_resumes_with_reseeded_generators(digits_train, tmp_path):
    module, optimizer, loader = resumable_run(digits_train)
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 2)
    save_checkpoint(tmp_path / "cpu.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    state = read_checkpoint(tmp_path / "cpu.pt")
    state["engine"]["generators"]["device"] = "cuda"  # as if written on a GPU
    write_checkpoint_state(tmp_path / "cuda.pt", state)
    module, optimizer, loader = resumable_run(digits_train)
    engine = optimizer.privacy_engine
    with pytest.warns(UserWarning, match="written on cuda and this run is on cpu: the noise and sampling generators "
                                         "are re-seeded at step 2"):
        load_checkpoint(tmp_path / "cuda.pt", module=module, optimizer=optimizer, engine=engine)
    assert engine.steps == 2
    saved = state["engine"]["generators"]["ranks"][0]
    assert not torch.equal(engine.noise_generator.get_state(), saved["noise"])
    assert not torch.equal(engine.sampling_generator.get_state(), saved["sampling"])
    train_steps(module, optimizer, endless_batches(loader), engine, 1)
    assert engine.steps == 3

    state["engine"]["generators"] = {"device": "cpu", "ranks": [saved, saved]}
    write_checkpoint_state(tmp_path / "two.pt", state)
    module, optimizer, _ = resumable_run(digits_train)
    with pytest.raises(CheckpointMismatchError, match=r"in number of processes: 2 \(checkpoint\) vs 1 \(this run\)"):
        load_checkpoint(tmp_path / "two.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)


def test_bad_devices_and_noise_shares_are_refused_by_name(digits_train):
    model = mlp(hidden=8)
    options = dict(mechanism="lap2", laplace_scale=1.0, delta=1e-5)
    for bad, message in (({"device": "tpu"}, "device must be one of auto, cpu, cuda or a torch device"),
                         ({"noise_shares": "half"}, "noise_shares must be one of split, rank0")):
        with pytest.raises(InvalidTrainingOptionError, match=message) as caught:
            make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train), **options,
                         **bad)
        assert isinstance(caught.value, DpnoiseError) and "\n" not in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_refused_by_name(digits_train):
    model = mlp(hidden=8)
    with pytest.raises(InvalidTrainingOptionError, match="device 'cuda': no CUDA device is available"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train),
                     mechanism="lap2", laplace_scale=1.0, delta=1e-5, device="cuda")
    config = TrainingConfig(DataConfig("digits"), PrivacyOptions(mechanism="lap2", noise=1.0, delta=1e-5, epochs=1),
                            Schedule(64), ExecutionOptions(device="cuda"))
    with pytest.raises(InvalidConfigError, match="^execution.device 'cuda': no CUDA device is available"):
        train_private(config)


# ------------------------------------------------------------------------------------------ CUDA (skip without a GPU)
@needs_cuda
@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "laplace-l1", "dirichlet", "penultimate-gaussian"])
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_every_mechanism_trains_on_cuda(digits_train, mechanism, grad_sample_mode):
    model = mlp(hidden=16)
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(digits_train, 64), mechanism=mechanism,
        delta=1e-5, **noise_keywords(mechanism, 1.0), device="cuda", seed=0, grad_sample_mode=grad_sample_mode)
    engine = optimizer.privacy_engine
    inputs, targets = next(iter(loader))
    assert inputs.is_cuda and targets.is_cuda and engine.noise_generator.device.type == "cuda"
    assert engine.sampling_generator.device.type == "cuda"
    train_steps(module, optimizer, endless_batches(loader), engine, 3)
    assert engine.steps == 3 and all(p.is_cuda and torch.isfinite(p).all() for p in model.parameters())
    if engine.mechanism.needs_per_sample_gradients:  # the first step's per-example check ran on CUDA
        assert engine.per_example_report.skipped is None and engine.per_example_report.exactness.error < 1e-5
    inputs, targets = next(iter(loader))  # a framework's round trip through the CPU keeps the provenance
    train_step(module, optimizer, (inputs.cpu().to("cuda"), targets.cpu().to("cuda")))
    assert engine.steps == 4


@needs_cuda
def test_cuda_noise_keeps_its_law():
    reference = torch.zeros(200_000, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    laplace = laplace_noise(reference, 0.7, 1.0, generator)
    gaussian = gaussian_noise(reference, 1.3, 0.5, generator)
    assert laplace.is_cuda and laplace.dtype == torch.float32
    assert stats.kstest(laplace.cpu().numpy(), stats.laplace(scale=0.7).cdf).pvalue > 1e-3
    assert stats.kstest(gaussian.cpu().numpy(), stats.norm(scale=0.65).cdf).pvalue > 1e-3


@needs_cuda
def test_a_cuda_checkpoint_resumes_on_the_cpu_and_back(digits_train, tmp_path):
    model = mlp(hidden=16)
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(digits_train, 64), mechanism="lap2",
        laplace_scale=1.0, delta=1e-5, device="cuda", seed=0, noise_seed=0)
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 2)
    save_checkpoint(tmp_path / "cuda.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    module, optimizer, loader = resumable_run(digits_train)
    with pytest.warns(UserWarning, match="re-seeded"):
        load_checkpoint(tmp_path / "cuda.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 1)
    save_checkpoint(tmp_path / "cpu.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    model = mlp(hidden=16)
    module, optimizer, loader = make_private(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), digits_loader(digits_train, 64), mechanism="lap2",
        laplace_scale=1.0, delta=1e-5, device="cuda", seed=0, noise_seed=0)
    with pytest.warns(UserWarning, match="re-seeded"):
        load_checkpoint(tmp_path / "cpu.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    assert optimizer.privacy_engine.steps == 3 and all(p.is_cuda for p in model.parameters())


def test_one_process_on_cuda_keeps_the_current_device(monkeypatch):
    # torch.cuda.set_device refuses a device without an index (torch 2.11 on an H200: `dpnoise train` failed
    # before any work); one process on "cuda" uses the current device, torchrun's ranks their cuda:LOCAL_RANK.
    from dpnoise.training.distributed import join_process_group

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert join_process_group(torch.device("cuda")) == (torch.device("cuda"), False) and chosen == []
    assert join_process_group(torch.device("cuda", 1)) == (torch.device("cuda", 1), False)
    assert chosen == [torch.device("cuda", 1)]
