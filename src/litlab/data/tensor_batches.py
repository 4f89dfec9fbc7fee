"""``TensorBatches``, a resumable loader of tensors in memory (batches drawn by index on the training
device: no workers, no per-sample collation; for files: ``ResumableDataLoader``), and the callbacks by
which every litlab run trains whole global batches and draws the same numbers, resumed or not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from litlab.errors import LitlabError


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the number of ranks: given values, else the process group's, else 0 of 1."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    return rank, world_size


def _seed_step(seed: int, epoch: int, batch: int, rank: int, device: torch.device) -> None:
    """Seed the generators a batch draws from on ``device`` (and the CPU) from (seed, epoch, batch, rank):
    each micro-batch and rank draws its own numbers, and a resumed run the same ones. Not
    torch.manual_seed: it also seeds every CUDA, XPU and MTIA device, far dearer than the CPU
    generator's seed even on a CPU-only machine (docs/performance.md, "Why the engine does it this way")."""
    seed = hash((seed, epoch, batch, rank)) % 2**63
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
    elif torch.cuda.is_initialized():  # work on a CPU tensor may move it to this rank's GPU and draw there
        torch.cuda.manual_seed(seed)


class ReseedEveryStep(Callback):
    """Reseeds before every training micro-batch (``_seed_step``): no RNG state needs to be in the
    checkpoint (numpy's would make torch's safe ``weights_only`` loading refuse it)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The epoch and the batch within it, not global_step: that counts optimizer steps, which all
        # micro-batches of one window share. Both are restored from the checkpoint on resume.
        _seed_step(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank, pl_module.device)


class WholeGlobalBatches(Callback):
    """Tells litlab's training loaders the fit's accumulation, as the process group tells them the ranks:
    they hand out whole global batches only (micro-batch x ranks x accumulation), dropping an epoch's
    last, incomplete one in every configuration (docs/sweeps.md, "What a row's difference can come from")."""

    accumulation = 1  # micro-batches per optimizer step of the fit in progress; 1 outside one

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        WholeGlobalBatches.accumulation = trainer.accumulate_grad_batches

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        WholeGlobalBatches.accumulation = 1


def micro_batches_per_epoch(samples: int, batch_size: int, world_size: int) -> int:
    """Micro-batches each rank trains in an epoch of ``samples``: whole global batches only."""
    global_batch = batch_size * world_size * WholeGlobalBatches.accumulation
    if samples < global_batch:
        raise LitlabError(
            f"the training split holds {samples} samples, fewer than one global batch of {global_batch}: "
            "lower data.batch_size, global_batch_size or the accumulation"
        )
    return samples // global_batch * WholeGlobalBatches.accumulation


class TensorBatches:
    """Batches of in-memory tensors indexed together along their first dimension ((inputs, targets),
    (tokens,) ...), sharded across ranks as ``ResumableDataLoader`` is. Shuffled (training) epochs hold
    whole global batches only, in an order that depends only on (seed, epoch); unshuffled (evaluation)
    ones every sample once. ``transform`` (of batch i's first tensor, e.g. augmentation) draws from an
    RNG seeded by (seed, epoch, i, rank), never the global one. Use it from ``train_dataloader``::

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
        self.epoch = 0
        self._consumed = 0  # batches of this epoch handed out so far
        self._skip = 0  # batches to skip at the next iter() (after a resume)
        self._order: Tensor | None = None  # this epoch's sample order on this rank, made by iter()
        self.sampler = self  # Lightning calls dataloader.sampler.set_epoch(epoch) before each epoch
        self.batch_sampler = None  # read by Lightning's DataLoader checks

    def set_epoch(self, epoch: int) -> None:
        # A restored position belongs to its epoch, which limit_train_batches may have ended early.
        if epoch != self.epoch:
            self._skip = 0
        self.epoch = epoch

    def _shard(self) -> Tensor:
        n = len(self.tensors[0])
        device = self.tensors[0].device
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            whole = len(self) * self.batch_size * self.world_size  # the epoch's whole global batches
            order = torch.randperm(n, generator=generator)[:whole].to(device)
        else:
            order = torch.arange(n, device=device)
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        n = len(self.tensors[0])
        if self.shuffle:
            return micro_batches_per_epoch(n, self.batch_size, self.world_size)
        return math.ceil(len(range(self.rank, n, self.world_size)) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        order = self._order = self._shard()
        start, self._skip = self._skip, 0
        self._consumed = start
        for i in range(start, len(self)):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            batch = [t[index] for t in self.tensors]
            if self.transform is not None:
                with torch.random.fork_rng(devices=[]):
                    _seed_step(self.seed, self.epoch, i, self.rank, self.tensors[0].device)
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
