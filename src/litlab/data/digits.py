"""scikit-learn's handwritten digits: 1797 8x8 grey images, shipped inside scikit-learn (offline)."""

from __future__ import annotations

import torch
from torch import Tensor

from litlab.data.memory import InMemoryImageDataModule


class DigitsDataModule(InMemoryImageDataModule):
    def load(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return images, torch.as_tensor(digits.target, dtype=torch.int64)
