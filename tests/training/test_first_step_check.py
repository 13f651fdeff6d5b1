"""make_private's per-example check: the first batch's per-example gradients are verified before any noise
(dpnoise.training.per_example_check, run by the optimizer); a mismatch refuses the run, the ledger untouched."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dpnoise.training import PerExampleCheckError, causal_lm_loss, make_private
from dpnoise.training.errors import UncheckedPerExampleGradientsWarning, UnsupportedLayerError


class MixesTheBatch(nn.Module):
    """Centres each input on the batch mean: every example's output depends on the others."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x - x.mean(0))


class PositionsWithoutBatch(nn.Module):
    """nanoGPT's positional embedding: ``wpe(torch.arange(t))``, an input without a batch dimension."""

    def __init__(self, tokens: int = 4) -> None:
        super().__init__()
        self.wte, self.wpe, self.head = nn.Embedding(10, 5), nn.Embedding(tokens, 5), nn.Linear(5, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        return self.head(hidden.mean(1))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def private(model: nn.Module, data: Dataset, batch_size: int = 20, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=batch_size),
                            mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, **options)


def features(n: int = 200) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator))


def train(module, optimizer, loader, steps: int) -> None:
    for _, (inputs, targets) in zip(range(steps), loader):
        optimizer.zero_grad()
        F.cross_entropy(module(inputs), targets).backward()
        optimizer.step()


@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_a_model_that_mixes_the_batch_is_refused_before_any_noise(grad_sample_mode):
    torch.manual_seed(0)
    model = MixesTheBatch()
    module, optimizer, loader = private(model, features(), grad_sample_mode=grad_sample_mode)
    engine = optimizer.privacy_engine
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):  # refused, and refused again: a failed check is never skipped
        with pytest.raises(PerExampleCheckError,
                           match=r"exactness vs. one-example autograd\): parameter linear\.weight \(Linear\)"):
            train(module, optimizer, loader, 1)
    assert engine.steps == 0 and all(acc.steps == 0 for acc in engine.accountants.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert engine.per_example_report is None


@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_an_exact_model_is_checked_once_and_trains(grad_sample_mode):
    torch.manual_seed(0)
    module, optimizer, loader = private(mlp(), features(), grad_sample_mode=grad_sample_mode)
    engine = optimizer.privacy_engine
    checks, check = [], optimizer.per_example_check
    optimizer.per_example_check = lambda batch: (checks.append(len(batch[1])), check(batch))
    train(module, optimizer, loader, 3)
    report = engine.per_example_report
    assert engine.steps == 3 and len(checks) == 1
    assert report.skipped is None and len(report.examples) == 3
    assert report.exactness.error < 1e-9 and report.independence.error < 1e-9


def test_physical_pieces_are_checked_before_the_logical_batchs_noise():
    torch.manual_seed(0)
    module, optimizer, loader = private(MixesTheBatch(), features(), batch_size=40, max_physical_batch_size=8)
    with pytest.raises(PerExampleCheckError):
        train(module, optimizer, loader, 1)
    assert optimizer.privacy_engine.steps == 0


def test_positions_without_a_batch_dimension_are_refused_at_any_batch_size():
    # t == B: only the check can tell (the shapes agree); t != B: the layer's input check names it first.
    data = TensorDataset(torch.randint(0, 10, (64, 4)), torch.randint(0, 3, (64,)))
    for seed in range(6):
        torch.manual_seed(seed)
        model = PositionsWithoutBatch(tokens=4)
        module, optimizer, loader = private(model, data, batch_size=4)
        with pytest.raises((PerExampleCheckError, UnsupportedLayerError), match="wpe"):
            train(module, optimizer, loader, 1)
        assert optimizer.privacy_engine.steps == 0


def test_turning_the_check_off_is_warned_and_then_nothing_stops_a_mixing_model():
    torch.manual_seed(0)
    model = MixesTheBatch()
    with pytest.warns(UncheckedPerExampleGradientsWarning, match="per_example_check=False"):
        module, optimizer, loader = make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(features(), batch_size=20),
            mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, per_example_check=False)
    train(module, optimizer, loader, 2)
    assert optimizer.privacy_engine.steps == 2 and optimizer.privacy_engine.per_example_report is None


class CausalLmData(Dataset):
    """Token sequences of unequal lengths (padding masked, labels -100), for a causal LM."""

    def __init__(self, n: int = 64, length: int = 8):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 50, (n, length), generator=generator)
        self.lengths = torch.randint(2, length + 1, (n,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        mask = (torch.arange(self.ids.shape[1]) < self.lengths[index]).long()
        return {"input_ids": self.ids[index] * mask, "attention_mask": mask,
                "labels": torch.where(mask.bool(), self.ids[index], torch.tensor(-100))}


def tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    return transformers.GPT2LMHeadModel(config).train()


def test_a_causal_lm_on_its_token_mean_loss_is_refused_and_trains_on_the_per_sequence_loss():
    model = tiny_gpt2()
    with pytest.raises(PerExampleCheckError, match="causal_lm_loss"):
        private(model, CausalLmData(), batch_size=8)
    model = tiny_gpt2()
    module, optimizer, loader = private(model, CausalLmData(), batch_size=8, loss_fn=causal_lm_loss)
    for _, batch in zip(range(2), loader):
        optimizer.zero_grad()
        causal_lm_loss(module(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"]).backward()
        optimizer.step()
    engine = optimizer.privacy_engine
    assert engine.steps == 2 and engine.per_example_report.exactness.error < 1e-5


def test_the_check_runs_again_in_a_resumed_run(tmp_path):
    from dpnoise.training import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    module, optimizer, loader = private(mlp(), features(), seed=0, noise_seed=0)
    train(module, optimizer, loader, 1)
    save_checkpoint(tmp_path / "run.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    torch.manual_seed(0)
    module, optimizer, loader = private(mlp(), features(), seed=0, noise_seed=0)
    load_checkpoint(tmp_path / "run.pt", module=module, optimizer=optimizer, engine=optimizer.privacy_engine)
    assert optimizer.privacy_engine.per_example_report is None
    train(module, optimizer, loader, 1)
    assert optimizer.privacy_engine.steps == 2 and optimizer.privacy_engine.per_example_report is not None


def test_a_training_run_reports_its_check_and_can_skip_it_explicitly(capsys):
    from dpnoise.cli.main import main

    argv = ["train", "--dataset", "digits", "--limit", "256", "--test-limit", "50", "--mechanism", "gaussian",
            "--delta", "1e-5", "--noise", "1", "--epochs", "0.25", "--batch-size", "64", "--threads", "1",
            "--no-progress", "--noise-seed", "0"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert re.search(r"per-example check: passed on examples \d+, \d+, \d+ of the first batch", printed)
    with pytest.warns(UncheckedPerExampleGradientsWarning, match="per_example_check=False"):
        assert main([*argv, "--no-per-example-check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["per_example_check"].startswith("skipped (--no-per-example-check)")
