"""``ReseedEveryStep``: random numbers that a resumed run draws exactly as an uninterrupted one would.

Before every training batch, the generators this rank draws from are reseeded from (seed, global
step, rank), so no RNG state needs to be in the checkpoint (numpy's would make torch's safe
``weights_only`` loading refuse it). Any LightningModule gets this.
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
        seed = (self.seed * 1_000_003 + trainer.global_step) * 1009 + trainer.global_rank
        # Only the generators this rank draws from: torch.manual_seed also seeds every CUDA, XPU and
        # MTIA device, far dearer than the CPU generator's seed even on a CPU-only machine
        # (docs/performance.md, "Why the engine does it this way").
        torch.default_generator.manual_seed(seed)
        if pl_module.device.type == "cuda":
            torch.cuda.manual_seed(seed)  # the current device, which Lightning set to this rank's
