"""``ImageClassifier``: a network that maps images to class logits, cross-entropy, and accuracy.

A plain LightningModule with torchmetrics. ``net`` names the network and its settings, ``optimizer``
and ``scheduler`` are partials; ``save_hyperparameters`` keeps them, so
``ImageClassifier.load_from_checkpoint(path)`` rebuilds a trained model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from project.schedules import optimizers


class ImageClassifier(L.LightningModule):
    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        channels_last: bool = False,
        image_shape: Sequence[int] | None = None,
        num_classes: int | None = None,
    ) -> None:
        """``image_shape`` and ``num_classes`` default to the datamodule's (read in ``setup``)."""
        super().__init__()
        self.save_hyperparameters(logger=False)  # the engine logs the whole run config
        self.loss = nn.CrossEntropyLoss()
        self.net: nn.Module | None = None
        if image_shape is not None and num_classes is not None:
            self.build(image_shape, num_classes)

    def build(self, image_shape: Sequence[int], num_classes: int) -> None:
        """The network and the metrics, for images of ``image_shape`` in ``num_classes`` classes."""
        self.hparams.image_shape, self.hparams.num_classes = list(image_shape), num_classes
        self.net = instantiate(self.hparams.net, image_shape=image_shape, num_classes=num_classes)
        if self.hparams.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        # validate_args=False: cross_entropy already rejects bad labels, and the checks read values
        # back from a GPU (a sync) every step.
        self.train_acc, self.val_acc, self.test_acc = (
            MulticlassAccuracy(num_classes, validate_args=False) for _ in range(3)
        )

    def setup(self, stage: str) -> None:
        if self.net is None:
            data = self.trainer.datamodule
            self.build(data.image_shape, data.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = self.loss(logits, labels)
        self.train_acc.update(logits, labels)
        self.log("train/loss_step", loss)
        # The epoch's mean over every rank's samples (sync_dist: reduced once, when the epoch ends).
        self.log("train/loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(labels))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def _evaluate(self, batch: tuple[Tensor, Tensor], accuracy: MulticlassAccuracy, split: str) -> None:
        images, labels = batch
        logits = self(images)
        accuracy.update(logits, labels)
        self.log(f"{split}/loss", self.loss(logits, labels), sync_dist=True, batch_size=len(labels))
        self.log(f"{split}/acc", accuracy, prog_bar=split == "val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_acc, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_acc, "test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        """Each image's most likely class and the probabilities of all classes (a label in the batch,
        as in the test split, is not read)."""
        probabilities = self(batch[0]).float().softmax(dim=1)
        return {"class": probabilities.argmax(dim=1), "probability": probabilities}

    def configure_optimizers(self) -> Any:
        return optimizers(self, self.hparams.optimizer, self.hparams.scheduler)
