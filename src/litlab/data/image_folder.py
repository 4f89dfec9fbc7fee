"""Your own images on disk, one sub-folder per class, read by ``torchvision.datasets.ImageFolder``.

``data.root`` is either ``root/<class>/<image>`` (split into train/val/test by ``val_fraction`` and
``test_fraction``, deterministically by ``split_seed``) or ``root/train/<class>/...`` with
``root/val/`` and optionally ``root/test/`` (test falls back to val). Images are resized to
``image_shape``'s height x width, converted to its channels, and normalised with ``mean``/``std``.
The folder is checked before torch loads (``schema.image_folder_classes``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader, Dataset, Subset

from litlab.schema import cpu_cores

log = logging.getLogger(__name__)


class ImageFolderDataModule(L.LightningDataModule):
    def __init__(
        self,
        name: str,
        image_shape: Sequence[int],
        num_classes: int,
        root: str,
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        augment: Sequence[Any] = (),
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
        global_batch_size: int | None = None,  # resolved into batch_size by litlab.build
    ) -> None:
        super().__init__()
        self.name, self.root = name, Path(root).expanduser()
        self.image_shape, self.num_classes = tuple(image_shape), num_classes
        self.batch_size = batch_size  # the tuner (tune.batch_size) sets this attribute
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.augment_config = list(augment)
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.mean, self.std = list(mean), list(std)
        self.splits: dict[str, Dataset] = {}

    def _transform(self, train: bool) -> Any:
        from torchvision.transforms import v2

        channels, height, width = self.image_shape
        steps: list[Any] = [
            v2.Grayscale(num_output_channels=1) if channels == 1 else v2.RGB(),
            v2.Resize((height, width), antialias=True),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
        ]
        if train:
            steps += [instantiate(t) for t in self.augment_config]
        steps.append(v2.Normalize(self.mean, self.std))
        return v2.Compose(steps)

    def _folder(self, path: Path, train: bool) -> Any:
        from torchvision.datasets import ImageFolder

        return ImageFolder(str(path), transform=self._transform(train))

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if (self.root / "train").is_dir() and (self.root / "val").is_dir():
            test_dir = self.root / "test" if (self.root / "test").is_dir() else self.root / "val"
            self.splits = {
                "train": self._folder(self.root / "train", train=True),
                "val": self._folder(self.root / "val", train=False),
                "test": self._folder(test_dir, train=False),
            }
        else:
            # The same file list twice: augmentation applies to the training split only.
            train_view, eval_view = self._folder(self.root, True), self._folder(self.root, False)
            n = len(train_view)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed)).tolist()
            n_test, n_val = int(n * self.test_fraction), int(n * self.val_fraction)
            self.splits = {
                "test": Subset(eval_view, order[:n_test]),
                "val": Subset(eval_view, order[n_test : n_test + n_val]),
                "train": Subset(train_view, order[n_test + n_val :]),
            }
        classes = _classes(self.splits["train"])
        if len(classes) != self.num_classes:
            raise ValueError(
                f"data.num_classes={self.num_classes} but data.root={self.root} has {len(classes)} "
                f"class folders ({', '.join(classes[:5])}...)"
            )
        log.info(
            "data %s: %d train, %d val, %d test images from %s, %d classes, resized to %s, %d workers",
            self.name,
            len(self.splits["train"]),
            len(self.splits["val"]),
            len(self.splits["test"]),
            self.root,
            len(classes),
            list(self.image_shape),
            self._workers(),
        )

    @property
    def num_train_samples(self) -> int:
        self.setup()
        return len(self.splits["train"])

    def _workers(self) -> int:
        if self.num_workers is not None:
            return self.num_workers
        # One loader per rank: share this machine's cores between the ranks on it, keep one for the
        # rank itself, and stop at 8 (beyond that, workers rarely speed up small images).
        devices = self.trainer.num_devices if self.trainer is not None else 1
        return max(0, min(8, cpu_cores() // devices - 1))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        workers = self._workers()
        pin_memory = self.pin_memory
        if pin_memory is None:
            pin_memory = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=workers > 0,  # no worker start-up cost at every epoch
            generator=torch.Generator().manual_seed(self.split_seed) if shuffle else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


def _classes(dataset: Dataset) -> list[str]:
    return list((dataset.dataset if isinstance(dataset, Subset) else dataset).classes)
