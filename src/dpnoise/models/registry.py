"""Named models: :func:`build_model` and :func:`count_trainable_parameters`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.models.efficientnet_lite import (
    EfficientNetLite0Classifier,
    FrozenFeatureClassifier,
    pretrained_efficientnet_lite0,
)
from dpnoise.models.errors import InvalidModelError
from dpnoise.models.minilm import build_minilm_features, minilm_sequence_classifier
from dpnoise.models.resnet_gn import SMALL_RESNET_WIDTHS, ResNetGN
from dpnoise.models.scatternet import build_scatternet


def _cnn(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return TFPrivacyTutorialCNN(num_classes, in_channels or 1, input_size or 28, **options)


def _resnet_gn(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return ResNetGN(num_classes, in_channels or 3, **options)


def _resnet_gn_small(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return ResNetGN(num_classes, in_channels or 3, widths=SMALL_RESNET_WIDTHS, **options)


def _minilm(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return minilm_sequence_classifier(num_classes, **options)


def _minilm_features(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return build_minilm_features(num_classes, **options)


def _rgb(name: str, in_channels: int | None) -> None:
    if in_channels not in (None, 3):
        raise InvalidModelError(f"{name} needs RGB images, got in_channels={in_channels}")


def _efficientnet(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    _rgb("efficientnet-lite0", in_channels)
    return EfficientNetLite0Classifier(pretrained_efficientnet_lite0(), num_classes, **options)


def _efficientnet_features(num_classes: int, in_channels: int | None, input_size: int | None,
                           **options: Any) -> nn.Module:
    _rgb("efficientnet-lite0-features", in_channels)
    return FrozenFeatureClassifier(pretrained_efficientnet_lite0(), num_classes, **options)


def _scatternet_linear(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return build_scatternet("linear", num_classes, in_channels or 1, input_size or 28, **options)


def _scatternet_cnn(num_classes: int, in_channels: int | None, input_size: int | None, **options: Any) -> nn.Module:
    return build_scatternet("cnn", num_classes, in_channels or 1, input_size or 28, **options)


# name -> (builder, default number of classes)
_BUILDERS: dict[str, tuple[Callable[..., nn.Module], int]] = {
    "cnn": (_cnn, 10),
    "resnet-gn": (_resnet_gn, 10),
    "resnet-gn-small": (_resnet_gn_small, 10),
    "minilm": (_minilm, 2),
    "minilm-features": (_minilm_features, 2),
    "efficientnet-lite0": (_efficientnet, 10),
    "efficientnet-lite0-features": (_efficientnet_features, 10),
    "scatternet-linear": (_scatternet_linear, 10),
    "scatternet-cnn": (_scatternet_cnn, 10),
}
MODELS = tuple(_BUILDERS)


def build_model(
    name: str,
    num_classes: int | None = None,
    in_channels: int | None = None,
    input_size: int | None = None,
    **options: Any,
) -> nn.Module:
    """Build a model by name; every model is ready for private training (no BatchNorm among trainable layers).

    Args:
        name: ``cnn`` (seed CNN; ``input_size`` < 16 selects the small-input variant), ``resnet-gn``
            (GroupNorm ResNet), ``resnet-gn-small`` (the same at half width, 4x fewer FLOPs), ``minilm`` (MiniLM-L6, Hugging Face's
            ``BertForSequenceClassification`` on dict batches; options ``trainable`` and ``lora_rank``, see
            :func:`~dpnoise.models.minilm.with_trainable_part`; :func:`~dpnoise.models.build_minilm` wraps it
            for plain token ids),
            ``minilm-features`` (frozen MiniLM-L6 sentence embeddings + linear head),
            ``efficientnet-lite0`` (ImageNet EfficientNet-Lite0 with a new linear head, every parameter
            trainable, BatchNorm frozen at its ImageNet statistics; option ``resolution``),
            ``efficientnet-lite0-features`` (frozen ImageNet backbone + linear head; option
            ``resolution``: the side images are resized to, default ``DEFAULT_RESOLUTION``),
            ``scatternet-linear`` / ``scatternet-cnn`` (frozen ScatterNet, J = 2, L = 8, under
            GroupNorm and a linear or small CNN head, Tramèr & Boneh 2021; option ``num_groups``,
            default 27; needs kymatio).
        num_classes: output classes (default 10, or 2 for ``minilm``).
        in_channels: image channels (``cnn``, ``scatternet-*``: default 1; ``resnet-gn``: default 3).
        input_size: image side in pixels (``cnn``, ``scatternet-*``: default 28; the other models do not need it).
        options: passed to the model's constructor.
    """
    try:
        builder, default_classes = _BUILDERS[name]
    except KeyError:
        raise InvalidModelError(f"unknown model {name!r}; choose from {list(MODELS)}") from None
    return builder(num_classes or default_classes, in_channels, input_size, **options)


def count_trainable_parameters(model: nn.Module) -> int:
    """Number of scalar parameters with ``requires_grad``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
