"""The one LightningModule: a network, cross-entropy loss and torchmetrics accuracy.

Its hyperparameters are the run's whole resolved config as plain Python containers, so checkpoints
load with torch's safe ``weights_only=True`` and ``litlab-eval`` can rebuild the module from them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy


class ClassifierModule(L.LightningModule):
    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        num_classes: int,
        total_steps: int,
        scheduler: Callable[..., Any] | None = None,
        scheduler_interval: str = "step",
        scheduler_frequency: int = 1,
        seed: int = 0,
        channels_last: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        # `config` is what a checkpoint needs to rebuild this module; the callables are not saved.
        self.save_hyperparameters({"config": config or {}, "total_steps": total_steps})
        self.net = net
        self.make_optimizer, self.make_scheduler = optimizer, scheduler
        self.scheduler_interval, self.scheduler_frequency = scheduler_interval, scheduler_frequency
        self.total_steps, self.seed, self.channels_last = total_steps, seed, channels_last
        self.loss = nn.CrossEntropyLoss()
        self.train_acc = MulticlassAccuracy(num_classes)
        self.val_acc = MulticlassAccuracy(num_classes)
        self.test_acc = MulticlassAccuracy(num_classes)
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout and other random ops draw from an RNG reseeded from (seed, step, rank): a resumed
        # run draws the same numbers as an uninterrupted one, with no RNG state in the checkpoint.
        torch.manual_seed((self.seed * 1_000_003 + self.global_step) * 1009 + self.global_rank)

    def _step(self, batch: tuple[Tensor, Tensor], stage: str, accuracy: MulticlassAccuracy) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = self.loss(logits, labels)
        accuracy(logits, labels)
        on_step = stage == "train"
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, sync_dist=not on_step)
        self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=stage != "test")
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)

    def configure_optimizers(self) -> Any:
        optimizer = self.make_optimizer(self.parameters())
        if self.make_scheduler is None:
            return optimizer
        scheduler = self.make_scheduler(optimizer, total_steps=self.total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "interval": self.scheduler_interval,
                "frequency": self.scheduler_frequency,
            },
        }
