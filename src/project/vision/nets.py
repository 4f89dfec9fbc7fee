"""Networks: plain ``torch.nn`` modules that take (N, C, H, W) images and return class logits."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


class MLP(nn.Module):
    def __init__(
        self,
        image_shape: Sequence[int],
        num_classes: int,
        hidden_sizes: Sequence[int] = (128, 64),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(image_shape)
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


class CNN(nn.Module):
    """conv-bn-relu blocks (each after the first halves the resolution), global pooling, linear."""

    def __init__(
        self,
        image_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        in_channels = image_shape[0]
        for i, out_channels in enumerate(channels):
            stride = 1 if i == 0 else 2
            blocks += [
                nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            in_channels = out_channels
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(in_channels, num_classes),
        )

    def forward(self, x):
        return self.head(self.features(x))


def resnet18(image_shape: Sequence[int], num_classes: int, small_inputs: bool = True) -> nn.Module:
    """torchvision's resnet18, randomly initialised; for small images a 3x3 stem without max-pool."""
    from torchvision.models import resnet18 as torchvision_resnet18

    net = torchvision_resnet18(weights=None, num_classes=num_classes)
    if small_inputs:
        net.conv1 = nn.Conv2d(image_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif image_shape[0] != 3:
        net.conv1 = nn.Conv2d(image_shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
