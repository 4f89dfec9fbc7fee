"""The one LightningModule: a network, cross-entropy loss, and accuracy (torchmetrics for evaluation).

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
        # validate_args=False: the argument checks cost ~10 us per batch on a CPU and, on GPUs, read
        # values back from the device (a sync) every step; cross_entropy already rejects bad labels.
        self.val_acc = MulticlassAccuracy(num_classes, validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, validate_args=False)
        # The training epoch's loss and accuracy are running sums on the device, not torchmetrics
        # objects: MulticlassAccuracy.update + MeanMetric.update cost 165 us a step on a 2-core CPU
        # against 15 us for these sums (measured; a tenth of a small model's step), and the epoch
        # means are the same numbers. They are reduced across ranks once an epoch.
        # None until the epoch's first batch: Lightning skips on_train_epoch_start when resuming mid-epoch.
        self._train_sums: Tensor | None = None  # [sum of loss x batch size, correct predictions]
        self._train_samples = 0
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout and other random ops draw from an RNG reseeded from (seed, step, rank): a resumed
        # run draws the same numbers as an uninterrupted one, with no RNG state in the checkpoint.
        seed = (self.seed * 1_000_003 + self.global_step) * 1009 + self.global_rank
        # Only the generators this rank draws from: torch.manual_seed also seeds every CUDA, XPU and
        # MTIA device, ~190 us a call even on a CPU-only machine (measured); the CPU one takes 1 us.
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)  # the current device, which Lightning set to this rank's

    def _logits_and_loss(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        images, labels = batch
        logits = self(images)
        return logits, self.loss(logits, labels)

    def _step(self, batch: tuple[Tensor, Tensor], accuracy: MulticlassAccuracy) -> Tensor:
        logits, loss = self._logits_and_loss(batch)
        # update(), not forward(): forward also computes this batch's accuracy (4x the cost, measured),
        # which nothing reads; accuracy is logged per epoch.
        accuracy.update(logits, batch[1])
        return loss

    def on_train_epoch_start(self) -> None:
        self._train_sums, self._train_samples = None, 0  # (also drops what a batch-size search left)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        logits, loss = self._logits_and_loss(batch)
        labels = batch[1]
        with torch.no_grad():
            correct = (logits.argmax(-1) == labels).sum()
            sums = torch.stack([loss.float() * labels.size(0), correct.float()])  # float32 also in bf16-true
            self._train_sums = sums if self._train_sums is None else self._train_sums.add_(sums)
        self._train_samples += labels.size(0)
        # No self.log in every step: each call costs ~0.7 ms of Python on a 2-core CPU (measured: a
        # third of a small model's step). The step loss is logged only on the steps the logger
        # writes (trainer.log_every_n_steps); the epoch means in on_train_epoch_end.
        every = self.trainer.log_every_n_steps
        if every and (self.global_step + 1) % every == 0:
            self.log("train/loss_step", loss, on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        mine = self._train_sums if self._train_sums is not None else torch.zeros(2, device=self.device)
        sums = torch.cat([mine, mine.new_tensor([self._train_samples])])
        loss_sum, correct, samples = self.trainer.strategy.reduce(sums, reduce_op="sum")  # all ranks
        if not samples:  # no training batch this epoch on any rank
            return
        # sync_dist: every rank already holds the same value (its mean is that value); without it
        # Lightning warns under DDP that an epoch-level tensor is not synchronised.
        self.log("train/loss", loss_sum / samples, sync_dist=True)
        self.log("train/acc", correct / samples, prog_bar=True, sync_dist=True)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss = self._step(batch, self.val_acc)
        self.log("val/loss", loss, sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss = self._step(batch, self.test_acc)
        self.log("test/loss", loss, sync_dist=True)
        self.log("test/acc", self.test_acc)

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
