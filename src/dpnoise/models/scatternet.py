"""ScatterNet features under a small trainable head (Tramèr & Boneh 2021, arXiv 2011.11660).

"Differentially Private Learning Needs Better Features (Or Much More Data)" trains private models
on a fixed, data-independent feature map: the 2-D scattering transform (kymatio, J = 2, L = 8, order
2: 81 coefficients per colour channel on a grid 4x smaller than the image, 81 x 7 x 7 on 28 x 28
grayscale, 243 x 8 x 8 on 32 x 32 RGB).  As the transform uses no data, it runs once over the
dataset (:func:`dpnoise.models.extract_features`, cached) and only the head is trained privately.

Their input conventions are kept: grayscale pixels in [0, 1] go in unchanged; RGB pixels are first
standardised with the ImageNet mean and std.  The heads follow their code (ftramer/Handcrafted-DP,
``models.py``): GroupNorm without affine parameters over the scattering channels (default 27
groups, their Fashion-MNIST setting; it needs no privacy budget, unlike their alternative of noisy
per-channel statistics), then

* ``linear``: one dense layer on the flattened features;
* ``cnn`` on grayscale (their MNIST / Fashion-MNIST network): Conv 16@3x3/2 (pad 1), Tanh,
  Conv 32@3x3/1 (pad 1), Tanh, Dense 32, Tanh, Dense classes;
* ``cnn`` on RGB (their CIFAR-10 network): Conv 64@3x3 (pad 1), Tanh, MaxPool 2, Conv 64@3x3
  (pad 1), Tanh, Dense classes.

No BatchNorm: every trainable layer (Conv2d, Linear) works with Opacus's hooks and with the
book-keeping clipping of :mod:`dpnoise.training.bookkeeping`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from dpnoise.models.errors import InvalidModelError
from dpnoise.models.kymatio_scattering import kymatio_version, scattering2d

SCATTER_J = 2
SCATTER_L = 8
#: GroupNorm groups over the scattering channels (Tramèr & Boneh's Fashion-MNIST setting)
DEFAULT_NUM_GROUPS = 27
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HEADS = ("linear", "cnn")
Head = Literal["linear", "cnn"]


def scattering_coefficients(J: int = SCATTER_J, L: int = SCATTER_L) -> int:
    """Coefficients per image channel of an order-2 scattering transform: 1 + J L + L^2 J (J - 1) / 2."""
    return 1 + J * L + L * L * J * (J - 1) // 2


class ScatterNet(nn.Module):
    """The frozen 2-D scattering transform: images ``(N, C, H, W)`` in [0, 1] to ``(N, 81 C, H/4, W/4)``.

    Channels are grouped by image channel (the first 81 are the red channel's for RGB); within one
    image channel, coefficient 0 is the low-pass average, 1..16 the first order, 17..80 the second.
    """

    def __init__(self, in_channels: int = 1, input_size: int = 28, J: int = SCATTER_J, L: int = SCATTER_L) -> None:
        super().__init__()
        if in_channels not in (1, 3):
            raise InvalidModelError(f"scatternet needs grayscale or RGB images, got in_channels={in_channels}")
        self.in_channels, self.input_size, self.J, self.L = in_channels, input_size, J, L
        self.transform = scattering2d((input_size, input_size), J=J, L=L)
        rgb = in_channels == 3
        # RGB images are standardised with ImageNet statistics (as Tramèr & Boneh); grayscale ones are not.
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN if rgb else (0.0,)).view(-1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD if rgb else (1.0,)).view(-1, 1, 1), persistent=False)
        self.input_normalization = "imagenet-mean-std" if rgb else "none"

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of the features of one image."""
        side = self.input_size // 2**self.J
        return self.in_channels * scattering_coefficients(self.J, self.L), side, side

    def train(self, mode: bool = True) -> ScatterNet:
        return super().train(False)  # nothing to train; stays in eval mode

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        expected = (self.in_channels, self.input_size, self.input_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise InvalidModelError(f"expected images (N, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
        if images.numel() and (images.min() < 0 or images.max() > 1):
            raise InvalidModelError("images must lie in [0, 1]: load the dataset with normalize=False")
        x = ((images.float() - self.mean) / self.std).contiguous()
        return self.transform(x).flatten(1, 2)  # (N, C, 81, h, w) -> (N, 81 C, h, w)


class ScatterLinearHead(nn.Module):
    """GroupNorm (no affine parameters) over the scattering channels, then one dense layer."""

    def __init__(self, feature_shape: tuple[int, int, int], num_classes: int = 10,
                 num_groups: int = DEFAULT_NUM_GROUPS) -> None:
        super().__init__()
        channels, height, width = feature_shape
        self.norm = _group_norm(num_groups, channels)
        self.fc = nn.Linear(channels * height * width, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(features).flatten(1))


class ScatterCNNHead(nn.Module):
    """GroupNorm over the scattering channels, then Tramèr & Boneh's small Tanh CNN.

    ``image_channels`` 1 selects their MNIST / Fashion-MNIST network (two convolutions, two dense
    layers; 33,066 parameters on 81 x 7 x 7 with 10 classes), 3 their CIFAR-10 one (two 64-channel
    convolutions around a max-pool, one dense layer; 187,210 parameters on 243 x 8 x 8).  The
    linear head has 39,700 and 155,530 parameters on the same features.
    """

    def __init__(self, feature_shape: tuple[int, int, int], num_classes: int = 10, image_channels: int = 1,
                 num_groups: int = DEFAULT_NUM_GROUPS) -> None:
        super().__init__()
        channels, height, width = feature_shape
        self.norm = _group_norm(num_groups, channels)
        if image_channels == 1:
            self.features = nn.Sequential(
                nn.Conv2d(channels, 16, kernel_size=3, stride=2, padding=1), nn.Tanh(),
                nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1), nn.Tanh(),
            )
            flat = 32 * ((height + 1) // 2) * ((width + 1) // 2)
            self.classifier = nn.Sequential(nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes))
        else:
            if min(height, width) < 2:
                raise InvalidModelError(f"the RGB scatternet CNN needs features of side >= 2, got {height}x{width}")
            self.features = nn.Sequential(
                nn.Conv2d(channels, 64, kernel_size=3, padding=1), nn.Tanh(),
                nn.MaxPool2d(kernel_size=2, stride=2),
                nn.Conv2d(64, 64, kernel_size=3, padding=1), nn.Tanh(),
            )
            self.classifier = nn.Linear(64 * (height // 2) * (width // 2), num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.norm(features)).flatten(1))


def _group_norm(num_groups: int, channels: int) -> nn.GroupNorm:
    if num_groups < 1 or channels % num_groups:
        raise InvalidModelError(f"num_groups must divide the {channels} scattering channels, got {num_groups}")
    return nn.GroupNorm(num_groups, channels, affine=False)


class ScatterNetClassifier(nn.Module):
    """The frozen :class:`ScatterNet` under a trainable head (a :class:`~dpnoise.models.FeatureClassifier`).

    ``forward`` takes images ``(N, C, H, W)`` in [0, 1] or precomputed features ``(N, 81 C, H/4,
    W/4)`` (told apart by their channel count); DP training should use the latter
    (:func:`dpnoise.models.extract_features`, computed once and cached), so that only ``head`` sees
    per-example gradients.  Both heads share the cached features.
    """

    def __init__(self, head: Head = "linear", num_classes: int = 10, in_channels: int = 1, input_size: int = 28,
                 num_groups: int = DEFAULT_NUM_GROUPS) -> None:
        super().__init__()
        if head not in HEADS:
            raise InvalidModelError(f"scatternet head must be one of {', '.join(HEADS)}, got {head!r}")
        self.scattering = ScatterNet(in_channels, input_size)
        shape = self.scattering.output_shape
        if head == "linear":
            self.head: nn.Module = ScatterLinearHead(shape, num_classes, num_groups)
        else:
            self.head = ScatterCNNHead(shape, num_classes, in_channels, num_groups)

    @property
    def feature_cache_tag(self) -> tuple[str, str]:
        s = self.scattering
        stem = f"scatternet-J{s.J}-L{s.L}-{s.in_channels}x{s.input_size}"
        return stem, f"kymatio-{kymatio_version()}:J={s.J}:L={s.L}:order=2:input={s.input_normalization}"

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Scattering features ``(N, 81 C, H/4, W/4)`` of images in [0, 1] (``normalize=False``)."""
        return self.scattering(images)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and x.shape[1] == self.scattering.in_channels:
            x = self.features(x)
        return self.head(x)


def build_scatternet(head: Head, num_classes: int = 10, in_channels: int = 1, input_size: int = 28,
                     num_groups: int = DEFAULT_NUM_GROUPS) -> ScatterNetClassifier:
    """``scatternet-linear`` / ``scatternet-cnn``: frozen ScatterNet (J = 2, L = 8) under a fresh head."""
    return ScatterNetClassifier(head, num_classes, in_channels, input_size, num_groups)
