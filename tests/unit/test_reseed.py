"""``ReseedEveryStep``: every micro-batch of an accumulation window draws its own random numbers, and a
run resumed from a checkpoint draws exactly what the uninterrupted run drew after it."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from litlab.data import TensorBatches, WholeGlobalBatches
from litlab.data.tensor_batches import ReseedEveryStep

ACCUMULATION, MICRO_BATCH = 4, 2
SAMPLES = torch.randn(53, 32)  # 6 whole global batches of 8 an epoch, and 5 samples left over


class _Draws(BoringModel):
    """Draws a number from the global generator in every training step, as dropout would."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[float] = []

    def train_dataloader(self):
        return TensorBatches((SAMPLES,), MICRO_BATCH, shuffle=True, seed=3)

    def training_step(self, batch, batch_idx):
        self.draws.append(float(torch.rand(())))
        return super().training_step(batch[0], batch_idx)


def _fit(tmp_path, *callbacks, ckpt_path=None) -> list[float]:
    module = _Draws()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, accumulate_grad_batches=ACCUMULATION, limit_val_batches=0,
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[ReseedEveryStep(seed=11), WholeGlobalBatches(), *callbacks],
    )  # fmt: skip
    trainer.fit(module, ckpt_path=ckpt_path)
    return module.draws


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[list[float], dict[int, str]]:
    """The draws of a 2-epoch fit, and its checkpoints by optimizer step."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    every = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=2, save_top_k=-1)
    draws = _fit(folder, every)
    return draws, {int(p.stem.split("=")[1]): str(p) for p in folder.glob("step=*.ckpt")}


def test_every_micro_batch_of_a_window_draws_its_own_numbers(uninterrupted):
    draws, _ = uninterrupted
    assert len(draws) == 2 * 6 * ACCUMULATION  # whole global batches only
    windows = [draws[i : i + ACCUMULATION] for i in range(0, len(draws), ACCUMULATION)]
    assert all(len(set(window)) == ACCUMULATION for window in windows), windows
    assert len(set(draws)) == len(draws)  # and no window or epoch repeats another's


@pytest.mark.parametrize("step", [2, 6, 8], ids=["mid-epoch", "epoch-end", "next-epoch"])
def test_a_resumed_fit_draws_exactly_what_the_uninterrupted_one_drew_after_its_checkpoint(
    uninterrupted, tmp_path, step
):
    draws, checkpoints = uninterrupted
    assert len(set(draws[:ACCUMULATION])) == ACCUMULATION  # per micro-batch, not per optimizer step
    assert _fit(tmp_path, ckpt_path=checkpoints[step]) == draws[step * ACCUMULATION :]
