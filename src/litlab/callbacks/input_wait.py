"""``InputWait``: how much of a training step is spent waiting for the next batch, the input pipeline's share.

Measured on this rank from the end of one training batch to the start of the next, skipping the
first batches and gaps across validation or an epoch boundary. On CUDA it can overstate the wait
(kernels may still run), which the doctor's threshold allows for.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

WARMUP_BATCHES = 3


class InputWait(Callback):
    """``report`` goes into summary.json as ``input_wait``: ``share``, ``wait_s``, ``step_s``, ``batches``."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}
        self._wait = 0.0
        self._step = 0.0
        self._batches = 0
        self._measured = 0
        self._last_end: float | None = None
        self._batch_start: float | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._last_end is not None and self._batches >= WARMUP_BATCHES:
            self._wait += now - self._last_end
            self._measured += 1
        self._batch_start = now

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._batch_start is not None and self._batches >= WARMUP_BATCHES:
            self._step += now - self._batch_start
        self._batches += 1
        self._last_end = now

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = None  # the wait across validation is not the input pipeline's

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = self._wait + self._step
        self.report.update(
            share=round(self._wait / total, 4) if total > 0 and self._measured else None,
            wait_s=round(self._wait, 3),
            step_s=round(self._step, 3),
            batches=self._measured,
        )
