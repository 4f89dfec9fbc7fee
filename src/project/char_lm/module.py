"""``CharLM``: a causal network that predicts every next character, cross-entropy, and perplexity.

A plain LightningModule with torchmetrics. Batches are ``(sequences,)`` of ``block_size + 1`` token
ids. ``net`` names the network and its settings, ``optimizer`` and ``scheduler`` are partials;
``save_hyperparameters`` keeps them, so ``CharLM.load_from_checkpoint(path)`` rebuilds a trained model.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from torch import Tensor, nn
from torch.nn import functional as F
from torchmetrics import MeanMetric

from project.schedules import optimizers


class CharLM(L.LightningModule):
    def __init__(
        self,
        net: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        vocab_size: int | None = None,
        block_size: int | None = None,
    ) -> None:
        """``vocab_size`` and ``block_size`` default to the datamodule's (read in ``setup``)."""
        super().__init__()
        self.save_hyperparameters(logger=False)  # the engine logs the whole run config
        # Token-weighted means of the loss over an evaluation epoch (reduced across ranks), so that
        # perplexity is exp(mean loss per character), not a mean of per-batch perplexities.
        # nan_strategy=nan keeps a NaN loss in the mean: the default drops it with a warning, and
        # "disable" also drops the weights (torchmetrics 1.8).
        self.val_loss, self.test_loss = (MeanMetric(nan_strategy=float("nan")) for _ in range(2))
        self.net: nn.Module | None = None
        if vocab_size is not None and block_size is not None:
            self.build(vocab_size, block_size)

    def build(self, vocab_size: int, block_size: int) -> None:
        """The network, for ``vocab_size`` token ids and contexts of ``block_size`` tokens."""
        self.hparams.vocab_size, self.hparams.block_size = vocab_size, block_size
        self.net = instantiate(self.hparams.net, vocab_size=vocab_size, block_size=block_size)

    def setup(self, stage: str) -> None:
        if self.net is None:
            data = self.trainer.datamodule
            self.build(data.vocab_size, data.block_size)

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits (N, T, vocab_size) of token ids (N, T)."""
        return self.net(tokens)

    def batch_tokens(self, batch: tuple[Tensor]) -> int:
        """Characters predicted in a batch (the engine's tokens/s counts these)."""
        sequences = batch[0]
        return sequences.shape[0] * (sequences.shape[1] - 1)

    def _loss(self, batch: tuple[Tensor]) -> Tensor:
        sequences = batch[0]
        logits = self(sequences[:, :-1])
        # float32 logits: the loss of 16-bit logits is coarse, and precision=*_true keeps them 16-bit.
        return F.cross_entropy(logits.float().flatten(0, 1), sequences[:, 1:].flatten())

    def training_step(self, batch: tuple[Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=self.batch_tokens(batch))

    def test_step(self, batch: tuple[Tensor], batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=self.batch_tokens(batch))

    def predict_step(self, batch: tuple[Tensor], batch_idx: int) -> dict[str, list[str]]:
        """Each sequence's first half as a prompt, and its continuation to the sequence's length,
        generated greedily (the most likely next character each time: the same text on every run)."""
        sequences = batch[0]
        prompt_length = sequences.shape[1] // 2
        tokens = sequences[:, :prompt_length]
        for _ in range(sequences.shape[1] - prompt_length):
            logits = self(tokens[:, -self.hparams.block_size :])[:, -1]
            tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
        # Token ids are ASCII codes (data.py's vocabulary).
        text = [bytes(row).decode("ascii") for row in tokens.tolist()]
        return {"prompt": [t[:prompt_length] for t in text], "generated": [t[prompt_length:] for t in text]}

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", self.test_loss)

    def _log_epoch(self, split: str, mean_loss: MeanMetric) -> None:
        loss = mean_loss.compute()  # the same value on every rank
        mean_loss.reset()
        # sync_dist: every rank already holds it; without it Lightning warns under DDP.
        self.log(f"{split}/loss", loss, prog_bar=split == "val", sync_dist=True)
        self.log(f"{split}/perplexity", loss.exp(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return optimizers(self, self.hparams.optimizer, self.hparams.scheduler)
