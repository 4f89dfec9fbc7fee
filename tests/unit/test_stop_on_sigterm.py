"""RankWatch's stop for a SIGTERM in one process: a SIGTERM stops the fit after the batch in progress,
and the same signal again, while the run records its outcome, does not end it (Lightning's teardown
puts back the handler it found when the fit began, which is litlab's)."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.run.hangs import RankWatch, restore_signal_handlers

_NO_LIMITS = SimpleNamespace(hang_timeout=0, preempt_grace=0)  # no watchdog: the stop alone


class _SigtermAt(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def received():
    """A Python SIGTERM handler installed before the fit (the run's outer one): what it received."""
    signals: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: signals.append(number))
    yield signals
    restore_signal_handlers()
    signal.signal(signal.SIGTERM, previous)


def _fit(tmp_path, *callbacks: Callback, max_steps: int = 10, accumulation: int = 1) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=accumulation,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[RankWatch(_NO_LIMITS, SimpleNamespace(dir=tmp_path), lambda *a, **k: None), *callbacks],
    )
    trainer.fit(BoringModel())
    return trainer


def test_a_second_sigterm_while_stopping_is_noted_not_acted_on(tmp_path, received, caplog) -> None:
    with pytest.raises(SIGTERMException):
        _fit(tmp_path, _SigtermAt(2))
    os.kill(os.getpid(), signal.SIGTERM)  # the run is recording its outcome: Lightning has torn down
    assert received == [], "the handler of before the fit acted while the run was stopping"
    assert "SIGTERM again on rank 0: the run is already stopping" in caplog.text
    restore_signal_handlers()  # the outcome is recorded
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGTERM]


def test_after_a_fit_that_was_not_stopped_the_handler_of_before_is_back(tmp_path, received) -> None:
    trainer = _fit(tmp_path, max_steps=2)
    assert trainer.global_step == 2
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGTERM]


class _Batches(Callback):
    def __init__(self) -> None:
        self.ended: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ended.append(batch_idx)


def test_a_sigterm_within_an_accumulation_window_stops_at_the_windows_optimizer_step(tmp_path, received):
    """Stopped after the batch in progress, a run with accumulation left the window's gradients
    accumulated and unsaved: preempted.ckpt's resume stepped on part of a window (not the run it
    would have been). The stop waits for the window's optimizer step."""
    batches = _Batches()
    with pytest.raises(SIGTERMException):
        _fit(tmp_path, _SigtermAt(5), batches, accumulation=4)  # batch 5: the second window's second
    assert batches.ended == list(range(8))  # the second window ended, and with it the second step
