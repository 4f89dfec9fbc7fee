"""``ResumableDataLoader``: a DataLoader over any map-style Dataset whose resume is exact.

Built on torchdata's ``StatefulDataLoader``, whose position (workers included) Lightning saves in
every checkpoint; this class also shards whole global batches across ranks by itself and makes the
order and each sample's random numbers depend only on (seed, epoch, index) (docs/storage.md, "Resuming
is exact"). Use it for the training split in your datamodule's ``train_dataloader``::

    return ResumableDataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, seed=self.seed,
                               num_workers=4, persistent_workers=True)
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from litlab.data.tensor_batches import micro_batches_per_epoch, rank_and_world_size


class _EpochSampler(DistributedSampler):
    """DistributedSampler over whole global batches (``WholeGlobalBatches``) whose indices carry their
    epoch, so a sample can seed itself from it."""

    def __init__(self, dataset: Dataset, batch_size: int, **kwargs: Any) -> None:
        super().__init__(dataset, drop_last=True, **kwargs)
        self.batch_size = batch_size

    def __len__(self) -> int:
        samples = len(self.dataset)  # type: ignore[arg-type]
        return micro_batches_per_epoch(samples, self.batch_size, self.num_replicas) * self.batch_size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return ((index, epoch) for index in itertools.islice(super().__iter__(), len(self)))


class _SeededSamples(Dataset):
    """Calls the dataset with the global RNGs seeded from (seed, epoch, index), in whatever process."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, epoch = key
        seed = hash((self.seed, epoch, index)) % 2**32
        # Not torch.manual_seed: it also seeds every CUDA, XPU and MTIA device (docs/performance.md).
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        return self.dataset[index]


class ResumableDataLoader(StatefulDataLoader):
    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``rank`` and ``world_size`` default to the process group's (0 of 1 without one)."""
        rank, world_size = rank_and_world_size(rank, world_size)
        sampler = _EpochSampler(
            dataset, batch_size, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
        )
        with warnings.catch_warnings():  # torchdata calls torch.set_vital, now a deprecated no-op
            warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
            super().__init__(
                _SeededSamples(dataset, seed),
                batch_size=batch_size,
                sampler=sampler,
                generator=torch.Generator(),
                **kwargs,
            )
        self.seed = seed
        self._restored_epoch: int | None = None

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing runs at iter(), so a position loaded after it (the sampler's epoch too)
        # is taken at the first batch (litlab.callbacks.loader_state).
        epoch = self.sampler.epoch
        if self._restored_epoch is not None and self._restored_epoch != epoch:
            self.next_iter_state = None  # saved in an earlier epoch: this one starts at its first batch
        self._restored_epoch = None
        self.generator.manual_seed(self.seed * 100_003 + epoch)  # worker seeds: never the global RNG
        yield from super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.sampler.epoch, "loader": super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored_epoch = state["epoch"]
        self.sampler.set_epoch(state["epoch"])
        super().load_state_dict(state["loader"])
