"""``ReseedEveryStep``: random numbers that a resumed run draws exactly as an uninterrupted one would.

Before every training micro-batch, the generators this rank draws from are reseeded from (seed, epoch,
batch, rank): each micro-batch of an accumulation window and each rank draws its own numbers, and no
RNG state needs to be in the checkpoint (numpy's would make torch's safe ``weights_only`` loading
refuse it). Any LightningModule gets this.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class ReseedEveryStep(Callback):
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The epoch and the batch within it, not global_step: that counts optimizer steps, which all
        # micro-batches of one window share. Both are restored from the checkpoint on resume.
        seed = hash((self.seed, trainer.current_epoch, batch_idx, trainer.global_rank)) % 2**63
        # Only the generators this rank draws from: torch.manual_seed also seeds every CUDA, XPU and
        # MTIA device, far dearer than the CPU generator's seed even on a CPU-only machine
        # (docs/performance.md, "Why the engine does it this way").
        torch.default_generator.manual_seed(seed)
        if pl_module.device.type == "cuda":
            torch.cuda.manual_seed(seed)  # the current device, which Lightning set to this rank's
