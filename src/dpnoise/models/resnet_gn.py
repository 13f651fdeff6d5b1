"""A small ResNet with GroupNorm (no BatchNorm), for DP-SGD on CIFAR-10 32x32."""

from __future__ import annotations

import torch
from torch import nn


#: Half the default widths: 78k parameters and about 4x fewer FLOPs, for CPU-sized CIFAR-10 runs.
SMALL_RESNET_WIDTHS = (16, 32, 64)


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class BasicBlock(nn.Module):
    """Two 3x3 conv + GroupNorm layers with an identity (or 1x1 conv + GroupNorm) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(out_channels, groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = _norm(out_channels, groups)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), _norm(out_channels, groups)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetGN(nn.Module):
    """Stem 3x3 conv, then one stage per width (the first at stride 1, the others at stride 2),
    global average pooling and a linear classifier.

    The default (widths 32/64/128, one block per stage, 8 groups) has 0.31M parameters.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        widths: tuple[int, ...] = (32, 64, 128),
        blocks_per_stage: int = 1,
        groups: int = 8,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), _norm(widths[0], groups), nn.ReLU()
        )
        layers: list[nn.Module] = []
        channels = widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(channels, width, stride, groups))
                channels = width
        self.stages = nn.Sequential(*layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.stages(self.stem(x))))
