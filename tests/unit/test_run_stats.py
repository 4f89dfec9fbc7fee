"""``RunStats``' epoch time counts only the epochs a fit saw from their start."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from litlab.callbacks.run_stats import RunStats


def test_a_fit_resumed_mid_epoch_reports_no_time_for_the_epoch_it_joined(tmp_path):
    def fit(stats: RunStats, ckpt_path=None) -> None:
        every_two_steps = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
        trainer = L.Trainer(
            default_root_dir=tmp_path,
            max_epochs=1,
            limit_train_batches=4,
            limit_val_batches=0,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[stats, every_two_steps],
        )
        trainer.fit(BoringModel(), ckpt_path=ckpt_path)

    whole = RunStats()
    fit(whole)
    assert whole.stats["seconds_per_epoch"] > 0
    # Lightning calls no on_train_epoch_start for the epoch a resumed fit joins, but its end.
    resumed = RunStats()
    fit(resumed, ckpt_path=tmp_path / "epoch=0-step=2.ckpt")
    assert resumed.stats["seconds_per_epoch"] is None
