"""Image datasets small enough to live in memory as tensors (digits, synthetic).

Batches are drawn by index from tensors that sit on the training device: no worker processes, no
per-sample collation. The training loader is *stateful*: Lightning stores its position in every
checkpoint (``loops.fit_loop.state_dict.combined_loader``), so a run resumed mid-epoch sees exactly
the batches an uninterrupted run would have seen. We write this loader instead of using
``torch.utils.data.DataLoader`` because a DataLoader re-shuffles from the start of the epoch on
resume, and because index-batching in-memory tensors is several times faster than collating samples.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor

log = logging.getLogger(__name__)


class TensorBatches:
    """Iterates (images, labels) batches of in-memory tensors, sharded across ranks.

    Shuffled order depends only on (seed, epoch); augmentation of batch i of epoch e draws from an
    RNG seeded by (seed, epoch, i), never from the global RNG. ``state_dict`` records how many batches
    of the current epoch were consumed, and ``load_state_dict`` makes the next ``iter()`` continue there.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        transform: Any = None,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size, self.transform = rank, world_size, transform
        # Training shards are padded to equal length (every rank must take the same number of
        # optimizer steps); evaluation shards are not, so metrics count every sample exactly once.
        self.pad = shuffle
        self.epoch = 0
        self._consumed = 0  # batches of this epoch handed out so far
        self._skip = 0  # batches to skip at the next iter() (after a resume)
        self.sampler = self  # Lightning calls dataloader.sampler.set_epoch(epoch) before each epoch
        self.batch_sampler = None  # read by Lightning's DataLoader checks

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            # A restored position belongs to the epoch it was saved in. A checkpoint taken after that
            # epoch's last batch (e.g. preempted during its validation) resumes into the next epoch,
            # which starts at its first batch; with trainer.limit_train_batches the saved position
            # can be short of len(self), so load_state_dict alone cannot tell.
            self._skip = 0
        self.epoch = epoch

    def _shard(self) -> Tensor:
        n = len(self.labels)
        device = self.labels.device
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(n, generator=generator).to(device)
        else:
            order = torch.arange(n, device=device)
        if self.pad and self.world_size > 1:
            total = math.ceil(n / self.world_size) * self.world_size
            order = torch.cat([order, order[: total - n]])
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        n = len(self.labels)
        per_rank = math.ceil(n / self.world_size) if self.pad else len(range(self.rank, n, self.world_size))
        return math.ceil(per_rank / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        order = self._shard()
        start, self._skip = self._skip, 0
        self._consumed = start
        for i in range(start, len(self)):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            images, labels = self.images[index], self.labels[index]
            if self.transform is not None:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(hash((self.seed, self.epoch, i)) % 2**63)
                    images = self.transform(images)
            self._consumed = i + 1
            yield images, labels

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self._consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        # A checkpoint taken on an epoch's last batch: the next iter() starts a fresh epoch.
        self._skip = state["consumed"] if state["consumed"] < len(self) else 0


class InMemoryImageDataModule(L.LightningDataModule):
    """Splits (images, labels) from ``load()`` into train/val/test, deterministically."""

    def __init__(
        self,
        name: str,
        image_shape: Sequence[int],
        num_classes: int,
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        augment: Sequence[Any] = (),
        global_batch_size: int | None = None,  # resolved into batch_size by litlab.build
    ) -> None:
        super().__init__()
        self.name = name
        self.image_shape = tuple(image_shape)
        self.num_classes = num_classes
        self.batch_size = batch_size
        self.val_fraction, self.test_fraction, self.split_seed = (
            val_fraction,
            test_fraction,
            split_seed,
        )
        # torchvision.transforms.v2 objects (Hydra instantiates the config's entries recursively).
        self.augment = list(augment)
        self.splits: dict[str, tuple[Tensor, Tensor]] = {}
        self._train_loader: TensorBatches | None = None

    def load(self) -> tuple[Tensor, Tensor]:
        """All images as a float tensor (N, C, H, W) and labels as int64 (N,)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            # Made before a Trainer was attached (build reads num_train_samples first): move them onto
            # the training device once, or every batch is copied from host memory on every step.
            device = self._device()
            if self.splits["train"][1].device != device:
                self.splits = {split: (x.to(device), y.to(device)) for split, (x, y) in self.splits.items()}
                log.info("data %s: moved to %s", self.name, device)
            return
        images, labels = self.load()
        if tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(
                f"data.image_shape={list(self.image_shape)} does not match the data's "
                f"shape {list(images.shape[1:])}"
            )
        n = len(labels)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        n_test, n_val = int(n * self.test_fraction), int(n * self.val_fraction)
        parts = {
            "test": order[:n_test],
            "val": order[n_test : n_test + n_val],
            "train": order[n_test + n_val :],
        }
        # Standardise with the training split's statistics only.
        train = images[parts["train"]]
        mean, std = train.mean(), train.std().clamp_min(1e-6)
        device = self._device()
        self.splits = {
            split: (((images[i] - mean) / std).to(device), labels[i].to(device)) for split, i in parts.items()
        }
        log.info(
            "data %s: %d train, %d val, %d test samples of shape %s, on %s",
            self.name,
            len(parts["train"]),
            len(parts["val"]),
            len(parts["test"]),
            list(self.image_shape),
            device,
        )

    def _device(self) -> torch.device:
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    @property
    def num_train_samples(self) -> int:
        self.setup()
        return len(self.splits["train"][1])

    def _loader(self, split: str, shuffle: bool, transform: Any = None) -> TensorBatches:
        images, labels = self.splits[split]
        trainer = self.trainer
        rank = trainer.global_rank if trainer is not None else 0
        world_size = trainer.world_size if trainer is not None else 1
        return TensorBatches(
            images,
            labels,
            self.batch_size,
            shuffle=shuffle,
            seed=self.split_seed,
            rank=rank,
            world_size=world_size,
            transform=transform,
        )

    def train_dataloader(self) -> TensorBatches:
        transform = None
        if self.augment:
            from torchvision.transforms import v2

            transform = v2.Compose(self.augment)
        self._train_loader = self._loader("train", shuffle=True, transform=transform)
        return self._train_loader

    def val_dataloader(self) -> TensorBatches:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> TensorBatches:
        return self._loader("test", shuffle=False)
