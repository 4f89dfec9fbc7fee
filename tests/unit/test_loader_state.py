"""``ResumableLoaderCheck``: a resumed fit draws exactly the batches the uninterrupted one drew after
its checkpoint, also where ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` (which
builds the train loader before the checkpoint is restored); a loader that cannot get its position is
reported, not claimed exact."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torchdata.stateful_dataloader import StatefulDataLoader

from litlab.callbacks.loader_state import ResumableLoaderCheck
from litlab.data import ResumableDataLoader, TensorBatches

SAMPLES = torch.arange(48, dtype=torch.float32)[:, None].expand(48, 32).contiguous()  # row i: all i


def _tensor_batches():
    return TensorBatches((SAMPLES,), batch_size=4, shuffle=True, seed=3)


def _resumable_loader():
    return ResumableDataLoader(SAMPLES, batch_size=4, shuffle=True, seed=3)


def _plain_stateful_loader():  # torchdata's own: it takes its position when iter() is called
    return StatefulDataLoader(SAMPLES, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))


class _Records(BoringModel):
    """Records the samples of every training batch; sizes its schedule early where asked."""

    def __init__(self, make_loader, sizes_schedule_early: bool) -> None:
        super().__init__()
        self.make_loader, self.sizes_schedule_early = make_loader, sizes_schedule_early
        self.seen: list[list[int]] = []

    def train_dataloader(self):
        return self.make_loader()

    def training_step(self, batch, batch_idx):
        inputs = batch[0] if isinstance(batch, tuple) else batch  # TensorBatches: a tuple of tensors
        self.seen.append(inputs[:, 0].int().tolist())
        return super().training_step(inputs, batch_idx)

    def configure_optimizers(self):
        if self.sizes_schedule_early:  # as a schedule sized to the run does (project/schedules.py)
            assert self.trainer.estimated_stepping_batches == 12  # 48 samples, 4 a batch, 1 epoch
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Record:
    resume_exact: bool | None = None


def _fit(tmp_path, module, *callbacks: Callback, ckpt_path=None) -> _Record:
    record = _Record()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[ResumableLoaderCheck(record), *callbacks],
    )  # fmt: skip
    trainer.fit(module, ckpt_path=ckpt_path)
    return record


@pytest.mark.parametrize("early", [True, False], ids=["built-early", "built-after-restore"])
@pytest.mark.parametrize("make_loader", [_tensor_batches, _resumable_loader], ids=["tensors", "resumable"])
def test_a_resumed_fit_draws_exactly_the_batches_the_uninterrupted_one_drew_after_its_checkpoint(
    tmp_path, make_loader, early
):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=5, save_top_k=-1)
    uninterrupted = _Records(make_loader, early)
    _fit(tmp_path, uninterrupted, checkpoint)
    assert len(uninterrupted.seen) == 12

    resumed = _Records(make_loader, early)
    record = _fit(tmp_path, resumed, ckpt_path=tmp_path / "step=5.ckpt")
    assert resumed.seen == uninterrupted.seen[5:]
    assert record.resume_exact is True


def test_a_loader_built_before_the_restore_that_took_its_position_then_is_reported(tmp_path, caplog):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=5, save_top_k=-1)
    _fit(tmp_path, _Records(_plain_stateful_loader, True), checkpoint)
    resumed = _Records(_plain_stateful_loader, True)
    with caplog.at_level(logging.WARNING, logger="litlab"):
        record = _fit(tmp_path, resumed, ckpt_path=tmp_path / "step=5.ckpt")
    assert record.resume_exact is False
    (warning,) = [r.getMessage() for r in caplog.records if "resume is not exact" in r.getMessage()]
    assert "StatefulDataLoader" in warning and "estimated_stepping_batches" in warning

    # Built after the restore, it gets its position from Lightning: exact.
    late = tmp_path / "late"
    checkpoint = ModelCheckpoint(dirpath=late, filename="{step}", every_n_train_steps=5, save_top_k=-1)
    uninterrupted = _Records(_plain_stateful_loader, False)
    _fit(late, uninterrupted, checkpoint)
    resumed = _Records(_plain_stateful_loader, False)
    assert _fit(late, resumed, ckpt_path=late / "step=5.ckpt").resume_exact is True
    assert resumed.seen == uninterrupted.seen[5:]
