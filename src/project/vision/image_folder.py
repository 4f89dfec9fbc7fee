"""Your own images on disk, one sub-folder per class, read by ``torchvision.datasets.ImageFolder``.

``data.root`` is ``root/<class>/<image>`` (split by ``val_fraction`` and ``test_fraction``) or
``root/train/``, ``root/val/`` and optionally ``root/test/``. The constructor checks the folder without
reading an image; training batches come from ``ResumableDataLoader`` (workers, exact resume).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from litlab.data import ResumableDataLoader

log = logging.getLogger(__name__)

# torchvision.datasets.folder.IMG_EXTENSIONS
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LAYOUT = "one sub-folder of images per class (root/<class>/<image>.png)"


class ImageFolderDataModule(L.LightningDataModule):
    def __init__(
        self,
        root: str,
        image_shape: Sequence[int] = (3, 32, 32),
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        augment: Sequence[Any] = (),
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        mean: Sequence[float] = (0.5,),
        std: Sequence[float] = (0.5,),
    ) -> None:
        super().__init__()
        self.root = Path(root).expanduser()
        if len(image_shape) != 3 or image_shape[0] not in (1, 3):
            raise ValueError(
                f"data.image_shape={list(image_shape)} is not allowed: use [channels, height, width] with "
                "channels 1 (grey) or 3 (RGB)"
            )
        self.image_shape = tuple(image_shape)
        self.classes = class_folders(self.root)
        self.num_classes = len(self.classes)
        self.batch_size = batch_size  # the batch-size finder (tune.batch_size) sets this attribute
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        # torchvision.transforms.v2 objects (Hydra instantiates the config's entries recursively).
        self.augment = list(augment)
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
            steps += self.augment
        steps.append(v2.Normalize(self.mean, self.std))
        return v2.Compose(steps)

    def _folder(self, path: Path, train: bool) -> Any:
        from torchvision.datasets import ImageFolder

        return ImageFolder(str(path), transform=self._transform(train))

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if _has_splits(self.root):
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
        log.info(
            "data image_folder: %d train, %d val, %d test images from %s, %d classes, resized to %s, "
            "%d workers",
            len(self.splits["train"]),
            len(self.splits["val"]),
            len(self.splits["test"]),
            self.root,
            self.num_classes,
            list(self.image_shape),
            self._workers(),
        )

    def _workers(self) -> int:
        if self.num_workers is not None:
            return self.num_workers
        # One loader per rank: share this machine's cores between the ranks on it, keep one for the
        # rank itself, and stop at 8 (beyond that, workers rarely speed up small images).
        devices = self.trainer.num_devices if self.trainer is not None else 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(0, min(8, cores // devices - 1))

    def _loader_options(self) -> dict[str, Any]:
        workers = self._workers()
        pin_memory = self.pin_memory
        if pin_memory is None:
            pin_memory = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # persistent_workers: no worker start-up cost at every epoch
        return {"num_workers": workers, "pin_memory": pin_memory, "persistent_workers": workers > 0}

    def train_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(
            self.splits["train"],
            batch_size=self.batch_size,
            shuffle=True,
            seed=self.split_seed,
            **self._loader_options(),
        )

    # A private generator: starting the workers draws their seed from it, not from the global RNG (a
    # resumed run starts them at another point than an uninterrupted one, and would end in another state).
    def val_dataloader(self) -> DataLoader:
        options = {**self._loader_options(), "generator": torch.Generator()}
        return DataLoader(self.splits["val"], batch_size=self.batch_size, **options)

    def test_dataloader(self) -> DataLoader:
        options = {**self._loader_options(), "generator": torch.Generator()}
        return DataLoader(self.splits["test"], batch_size=self.batch_size, **options)


def _has_splits(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "val").is_dir()


def class_folders(root: Path) -> list[str]:
    """Class names (sub-folders holding images) of ``root``, or of ``root/train`` when it has train/
    and val/ splits. Raises ValueError for a missing, unreadable or empty folder."""
    if not root.is_dir():
        raise ValueError(f"data.root={root} is not a folder: point it at a folder with {LAYOUT}")
    folder = root / "train" if _has_splits(root) else root
    try:
        classes = sorted(
            d.name
            for d in folder.iterdir()
            if d.is_dir() and any(f.suffix.lower() in IMAGE_EXTENSIONS for f in d.rglob("*"))
        )
    except OSError as error:
        raise ValueError(f"data.root={root} cannot be read ({error.strerror})") from error
    if not classes:
        raise ValueError(
            f"data.root={root} holds no images: expected {LAYOUT}, with files ending in "
            + ", ".join(IMAGE_EXTENSIONS)
        )
    return classes
