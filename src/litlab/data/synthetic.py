"""Deterministic random images of any shape, for benchmarks and shape tests.

Labels come from a fixed random linear "teacher" on a smoothed copy of each image, so the task is
learnable (accuracy well above chance) and identical on every machine for the same seed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from litlab.data.memory import InMemoryImageDataModule


class SyntheticDataModule(InMemoryImageDataModule):
    def __init__(self, *args: Any, num_samples: int = 2048, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_samples = num_samples

    def load(self) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(self.split_seed + 1)
        images = torch.randn(self.num_samples, *self.image_shape, generator=generator)
        pooled = torch.nn.functional.adaptive_avg_pool2d(images, 4).flatten(1)
        teacher = torch.randn(pooled.shape[1], self.num_classes, generator=generator)
        return images, (pooled @ teacher).argmax(dim=1)
