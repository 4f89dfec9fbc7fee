"""``ImageClassifier``: a network that maps images to class logits, cross-entropy, and accuracy.

A plain LightningModule. The network comes as a partial (``model.net`` with ``_partial_: true``) and
is built in ``setup`` for the datamodule's ``image_shape`` and ``num_classes``, so every model config
works with every image datamodule. Validation and test accuracy use torchmetrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from project.schedules import optimizers


class ImageClassifier(L.LightningModule):
    def __init__(
        self,
        net: Callable[..., nn.Module],
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.make_net, self.make_optimizer, self.make_scheduler = net, optimizer, scheduler
        self.channels_last = channels_last
        self.net: nn.Module | None = None
        self.loss = nn.CrossEntropyLoss()
        # The training epoch's loss and accuracy are running sums on the device, not torchmetrics
        # objects: MulticlassAccuracy.update + MeanMetric.update cost 165 us a step on a 2-core CPU
        # against 15 us for these sums (measured; a tenth of a small model's step), and the epoch
        # means are the same numbers. They are reduced across ranks once an epoch.
        # None until the epoch's first batch: Lightning skips on_train_epoch_start when resuming mid-epoch.
        self._train_sums: Tensor | None = None  # [sum of loss x batch size, correct predictions]
        self._train_samples = 0

    def setup(self, stage: str) -> None:
        if self.net is not None:
            return
        data = self.trainer.datamodule
        self.net = self.make_net(image_shape=data.image_shape, num_classes=data.num_classes)
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        # validate_args=False: the argument checks cost ~10 us per batch on a CPU and, on GPUs, read
        # values back from the device (a sync) every step; cross_entropy already rejects bad labels.
        self.val_acc = MulticlassAccuracy(data.num_classes, validate_args=False)
        self.test_acc = MulticlassAccuracy(data.num_classes, validate_args=False)

    def forward(self, images: Tensor) -> Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def _logits_and_loss(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        images, labels = batch
        logits = self(images)
        return logits, self.loss(logits, labels)

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

    def _evaluate(self, batch: tuple[Tensor, Tensor], accuracy: MulticlassAccuracy, split: str) -> None:
        logits, loss = self._logits_and_loss(batch)
        # update(), not forward(): forward also computes this batch's accuracy (4x the cost, measured),
        # which nothing reads; accuracy is logged per epoch.
        accuracy.update(logits, batch[1])
        self.log(f"{split}/loss", loss, sync_dist=True)
        self.log(f"{split}/acc", accuracy, prog_bar=split == "val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_acc, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_acc, "test")

    def configure_optimizers(self) -> Any:
        return optimizers(self, self.make_optimizer, self.make_scheduler)
