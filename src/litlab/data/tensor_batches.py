"""``TensorBatches``: a resumable loader for datasets that live in memory as tensors.

Batches are drawn by index from tensors on the training device: no workers, no per-sample collation.
Lightning stores its position in every checkpoint, so a run resumed mid-epoch sees exactly the batches
an uninterrupted one would. For datasets read from files: ``litlab.data.ResumableDataLoader``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the number of ranks, from the process group when one exists (as
    ``torch.utils.data.DistributedSampler`` finds them); 0 of 1 otherwise. Given values win."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    return rank, world_size


class TensorBatches:
    """Iterates batches of in-memory tensors (any number of them, indexed together along their first
    dimension: (inputs, targets), (tokens,) ...), sharded across ranks: each rank finds its share
    from the process group, as ``ResumableDataLoader`` does (``rank`` and ``world_size`` override it).

    Shuffled order depends only on (seed, epoch); ``transform`` (applied to the first tensor of batch
    i of epoch e, e.g. augmentation of the inputs) draws from an RNG seeded by (seed, epoch, i, rank),
    never from the global RNG: each rank draws its own. ``state_dict`` records how many batches of
    the current epoch were consumed, and ``load_state_dict`` makes the next ``iter()`` continue there
    (read at its first batch). Use it from your datamodule's ``train_dataloader`` (and, unshuffled,
    for evaluation)::

        return TensorBatches((images, labels), self.batch_size, shuffle=True, seed=self.seed)
    """

    def __init__(
        self,
        tensors: Sequence[Tensor],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        transform: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.tensors = tuple(tensors)
        if not self.tensors or len({len(t) for t in self.tensors}) != 1:
            raise ValueError("TensorBatches needs one or more tensors of the same length (first dimension)")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.transform = transform
        # Training shards are padded to equal length (every rank must take the same number of
        # optimizer steps); evaluation shards are not, so metrics count every sample exactly once.
        self.pad = shuffle
        self.epoch = 0
        self._consumed = 0  # batches of this epoch handed out so far
        self._skip = 0  # batches to skip at the next iter() (after a resume)
        self._order: Tensor | None = None  # this epoch's sample order on this rank, made by iter()
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
        n = len(self.tensors[0])
        device = self.tensors[0].device
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
        n = len(self.tensors[0])
        per_rank = math.ceil(n / self.world_size) if self.pad else len(range(self.rank, n, self.world_size))
        return math.ceil(per_rank / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        order = self._order = self._shard()
        start, self._skip = self._skip, 0
        self._consumed = start
        for i in range(start, len(self)):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            batch = [t[index] for t in self.tensors]
            if self.transform is not None:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(hash((self.seed, self.epoch, i, self.rank)) % 2**63)
                    batch[0] = self.transform(batch[0])
            self._consumed = i + 1
            yield tuple(batch)

    def batch_indices(self, batch_idx: int) -> list[int]:
        """The indices into the tensors of this rank's batch ``batch_idx`` of the current epoch:
        litlab-predict writes them beside each prediction (Lightning tracks them for DataLoaders only)."""
        order = self._shard() if self._order is None else self._order
        return order[batch_idx * self.batch_size : (batch_idx + 1) * self.batch_size].tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self._consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        # A checkpoint taken on an epoch's last batch: the next iter() starts a fresh epoch.
        self._skip = state["consumed"] if state["consumed"] < len(self) else 0
