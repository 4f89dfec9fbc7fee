"""Image datasets small enough to live in memory as tensors: the digits, and synthetic images.

``InMemoryImages`` splits what ``load()`` returns into train/val/test by ``split_seed``, standardises
it, and serves it from the training device with ``TensorBatches``, augmented by ``augment`` (kornia
augmentations: each sample its own draw, a batch at a time). A new in-memory dataset is a subclass
with ``load()``, ``image_shape`` and ``num_classes``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from litlab.data import TensorBatches
from project.splits import seeded_splits

log = logging.getLogger(__name__)


class InMemoryImages(L.LightningDataModule):
    """Images (N, C, H, W) and int64 labels (N,) from ``load()``, split into train/val/test."""

    image_shape: tuple[int, ...]
    num_classes: int

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        augment: Sequence[Any] = (),
    ) -> None:
        super().__init__()
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must each be at "
                "least 0, and together below 1"
            )
        self.batch_size = batch_size  # the batch-size finder (tune.batch_size) sets this attribute
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        # kornia.augmentation objects (Hydra instantiates the config's entries recursively).
        self.augment = batch_augmentations(augment)
        self.splits: dict[str, tuple[Tensor, Tensor]] = {}

    def load(self) -> tuple[Tensor, Tensor]:
        """All images as a float tensor (N, C, H, W) and labels as int64 (N,)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        if self.splits:
            return
        images, labels = self.load()
        n = len(labels)
        parts = seeded_splits(n, self.val_fraction, self.test_fraction, self.split_seed)
        # Standardise with the training split's statistics only.
        train = images[parts["train"]]
        mean, std = train.mean(), train.std().clamp_min(1e-6)
        # On the training device once: otherwise every batch is copied from host memory every step.
        self.splits = {
            split: (((images[i] - mean) / std).to(device), labels[i].to(device)) for split, i in parts.items()
        }
        log.info(
            "data %s: %d train, %d val, %d test samples of shape %s, on %s",
            type(self).__name__,
            len(parts["train"]),
            len(parts["val"]),
            len(parts["test"]),
            list(self.image_shape),
            device,
        )

    def _loader(self, split: str, shuffle: bool, transform: Any = None) -> TensorBatches:
        return TensorBatches(
            self.splits[split], self.batch_size, shuffle=shuffle, seed=self.split_seed, transform=transform
        )

    def train_dataloader(self) -> TensorBatches:
        return self._loader("train", shuffle=True, transform=in_turn(self.augment))

    def val_dataloader(self) -> TensorBatches:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> TensorBatches:
        return self._loader("test", shuffle=False)


def batch_augmentations(entries: Sequence[Any]) -> list[Any]:
    """The ``augment`` entries, each applied to a whole training batch on the training device.

    kornia's augmentations draw the parameters of each sample of a batch (``same_on_batch=False``,
    from the CPU generator ``TensorBatches`` seeds per batch) in one batched call. torchvision's v2
    transforms, given a batch, draw one rotation, crop or flip for all its samples, and applied to
    each sample in turn they cost more than the step itself (docs/performance.md, "Augmentation"):
    so they are refused here, with the kornia class to use instead.
    (``data=image_folder`` augments the images it reads from files one at a time, in its loader's
    workers: there torchvision's transforms are the ones to use.)
    """
    for i, entry in enumerate(entries):
        cls = type(entry)
        if cls.__module__.startswith("torchvision.transforms"):
            public = ".".join(part for part in cls.__module__.split(".") if not part.startswith("_"))
            raise ValueError(
                f"data.augment.{i}={public}.{cls.__name__} would draw one set of parameters for the "
                f"whole batch: use kornia.augmentation entries (kornia.augmentation.{cls.__name__} where "
                "kornia has it), which draw each sample's own"
            )
    return list(entries)


def in_turn(steps: Sequence[Any]) -> Any:
    """One transform of a batch that applies ``steps`` in turn (None when there are none). A partial
    of a module-level function, so that the loader holding it stays picklable."""
    return functools.partial(_apply_in_turn, tuple(steps)) if steps else None


def _apply_in_turn(steps: tuple[Any, ...], images: Tensor) -> Tensor:
    for step in steps:
        images = step(images)
    return images


class DigitsDataModule(InMemoryImages):
    """scikit-learn's handwritten digits: 1797 grey 8x8 images of 10 digits, shipped inside
    scikit-learn, so it works offline."""

    image_shape = (1, 8, 8)
    num_classes = 10

    def load(self) -> tuple[Tensor, Tensor]:
        table = _digits_table()
        images = torch.as_tensor(table[:, :-1], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        return images, torch.as_tensor(table[:, -1], dtype=torch.int64)


def _digits_table() -> np.ndarray:
    """The digits as rows of 64 pixels and a label. Read straight from scikit-learn's data file:
    ``sklearn.datasets.load_digits`` would first import all of scikit-learn at every start."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else None
    if path is not None and path.is_file():
        return np.loadtxt(path, delimiter=",")
    from sklearn.datasets import load_digits  # the file moved: the slower, public way

    digits = load_digits()
    return np.column_stack([digits.data, digits.target])


class SyntheticDataModule(InMemoryImages):
    """Deterministic random images of any shape, for benchmarks and shape tests. Labels come from a
    fixed random linear "teacher" on a smoothed copy of each image, so the task is learnable
    (accuracy well above chance) and identical on every machine for the same seed."""

    def __init__(
        self,
        image_shape: Sequence[int] = (3, 32, 32),
        num_classes: int = 10,
        num_samples: int = 2048,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ValueError(
                f"data.image_shape={list(image_shape)} is not allowed: use [channels, height, width]"
            )
        self.image_shape, self.num_classes, self.num_samples = tuple(image_shape), num_classes, num_samples

    def load(self) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(self.split_seed + 1)
        images = torch.randn(self.num_samples, *self.image_shape, generator=generator)
        pooled = torch.nn.functional.adaptive_avg_pool2d(images, 4).flatten(1)
        teacher = torch.randn(pooled.shape[1], self.num_classes, generator=generator)
        return images, (pooled @ teacher).argmax(dim=1)
