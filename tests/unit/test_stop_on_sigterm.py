"""RankWatch's stop for a SIGTERM: in one process it stops the fit after the batch in progress, and
the same signal again, while the run records its outcome, does not end it (Lightning's teardown puts
back the handler it found when the fit began, which is litlab's); under DDP a SIGTERM to any one rank
stops every rank after the same batch."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.callbacks.nonfinite import NonFiniteLossGuard
from litlab.run.hangs import RankWatch, restore_signal_handlers

_NO_LIMITS = SimpleNamespace(hang_timeout=0, preempt_grace=0)  # no watchdog: the stop alone


class _SigtermAt(Callback):
    def __init__(self, batch: int, rank: int = 0) -> None:
        self.batch, self.rank = batch, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def received():
    """A Python SIGTERM handler installed before the fit (the run's outer one): what it received."""
    signals: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: signals.append(number))
    yield signals
    restore_signal_handlers()
    signal.signal(signal.SIGTERM, previous)


def _fit(tmp_path, *callbacks: Callback, max_steps: int = 10, accumulation: int = 1, **more) -> L.Trainer:
    watch = RankWatch(_NO_LIMITS, SimpleNamespace(dir=tmp_path), lambda *a, **k: None)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=more.pop("devices", 1),
        max_steps=max_steps,
        accumulate_grad_batches=accumulation,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[watch, NonFiniteLossGuard(rider=watch), *callbacks],  # as every run has them
        **more,
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


class _BatchesOnFile(Callback):
    """Each rank's ended batches, in a file: the ranks are processes of their own."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with open(self.folder / f"rank{trainer.global_rank}.txt", "a") as ended:
            ended.write(f"{batch_idx}\n")


def _rank(rank: int, folder, port: int, signalled: int, at: int, accumulation: int) -> None:
    """One rank of a 2-rank DDP fit, started as torchrun would (Lightning launches none)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0")
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank))
    with contextlib.suppress(SIGTERMException):
        fault = _SigtermAt(at, signalled)
        _fit(folder, fault, _BatchesOnFile(folder), devices=2, strategy="ddp", accumulation=accumulation)


@pytest.mark.parametrize(("at", "accumulation", "last"), [(3, 1, 3), (5, 4, 7)])
@pytest.mark.parametrize("signalled", [0, 1])
def test_a_sigterm_to_one_rank_stops_every_rank_after_the_same_batch(
    tmp_path, signalled, at, accumulation, last
):
    """The ranks agree at each optimizer step, in the non-finite guard's sum (no collective of the
    stop's own on a batch's path): noted as batch 3 starts, the stop comes after batch 3 on both ranks;
    with accumulation, noted in the second window's second batch, after that window (batch 7)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    fork = multiprocessing.get_context("fork")
    args = (tmp_path, port, signalled, at, accumulation)
    ranks = [fork.Process(target=_rank, args=(rank, *args)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
        process.kill()
    assert [process.exitcode for process in ranks] == [0, 0]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text().split() == [str(b) for b in range(last + 1)], rank
