"""Seed CNN and GroupNorm ResNet: parameter counts, shapes, Opacus per-example gradients."""

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from dpnoise.models import MODELS, ResNetGN, TFPrivacyTutorialCNN, build_model, count_trainable_parameters

from per_example_reference import single_example_gradients


def test_seed_cnn_is_the_tutorial_network_with_26010_parameters():
    model = build_model("cnn")
    assert count_trainable_parameters(model) == 26_010
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (16, (8, 8), (2, 2), (3, 3)),
        (32, (4, 4), (2, 2), (0, 0)),
    ]
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride) for p in pools] == [(2, 1), (2, 1)]
    dense = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(d.in_features, d.out_features) for d in dense] == [(32 * 4 * 4, 32), (32, 10)]
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)


def test_seed_cnn_adapts_to_digits_and_rgb():
    small = build_model("cnn", in_channels=1, input_size=8)
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert count_trainable_parameters(small) == 9_258
    rgb = TFPrivacyTutorialCNN(num_classes=5, in_channels=3, input_size=32)
    assert rgb(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_resnet_gn_size_and_no_batchnorm():
    model = build_model("resnet-gn")
    assert 200_000 <= count_trainable_parameters(model) <= 1_000_000
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert ResNetGN(num_classes=3, blocks_per_stage=2)(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    small = build_model("resnet-gn-small")
    assert 3.5 * count_trainable_parameters(small) < count_trainable_parameters(model)
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize(
    "name, shape", [("cnn", (1, 28, 28)), ("resnet-gn", (3, 32, 32))]
)
def test_opacus_per_example_gradients_match_single_example_gradients(name, shape):
    torch.manual_seed(0)
    model = build_model(name)
    assert ModuleValidator.validate(model, strict=False) == []
    x, y = torch.randn(4, *shape), torch.tensor([0, 1, 2, 3])
    reference = single_example_gradients(model, x, y)
    wrapped = GradSampleModule(model, loss_reduction="sum")
    nn.functional.cross_entropy(wrapped(x), y, reduction="sum").backward()
    for j, p in enumerate(model.parameters()):
        assert p.grad_sample.shape == (4, *p.shape)
        for i in range(4):
            torch.testing.assert_close(p.grad_sample[i], reference[j][i], rtol=1e-4, atol=1e-5)


def test_unknown_model_is_rejected():
    assert set(MODELS) == {"cnn", "resnet-gn", "resnet-gn-small", "minilm", "minilm-features",
                           "efficientnet-lite0", "efficientnet-lite0-features", "scatternet-linear", "scatternet-cnn"}
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vit")


def test_channels_last_pooling_matches_maxpool_values_and_gradients():
    from dpnoise.models.cnn import MaxPool2dChannelsLast

    torch.manual_seed(0)
    x = torch.relu(torch.randn(5, 16, 14, 14)).requires_grad_(True)  # ReLU zeros: many ties
    reference = x.detach().clone().requires_grad_(True)
    ours, theirs = MaxPool2dChannelsLast(2, stride=1)(x), nn.MaxPool2d(2, stride=1)(reference)
    assert torch.equal(ours, theirs) and ours.is_contiguous()
    weights = torch.randn_like(ours)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    positive = reference.detach() > 0  # where a ReLU upstream would pass the gradient on
    torch.testing.assert_close(x.grad[positive], reference.grad[positive], rtol=0, atol=0)
