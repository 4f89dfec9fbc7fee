"""Checkpoints: what a run writes (``run_checkpoints``: the best ``save_top_k``, ``last.ckpt``, and
preempted.ckpt on SIGTERM), how (``AtomicCheckpointIO``: whole or not at all), what each carries (the
run's config, for ``litlab-eval``), and what a stopped run leaves to resume from. docs/storage.md."""

from __future__ import annotations

import functools
import io
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.errors import EXIT_FAILED, LitlabError, first_line
from litlab.heartbeat import HEARTBEAT, CountingWriter
from litlab.library_internals import last_global_step_saved
from litlab.storage.resume import read_checkpoint
from litlab.storage.roots import copy_changed_files, failed_storage, write_atomic, writing

log = logging.getLogger(__name__)

_LAST = "last"


def run_checkpoints(
    dirpath: str,
    monitor: str | None = None,
    mode: str = "max",
    save_top_k: int = 1,
    save_last: bool = True,
    every_n_epochs: int | None = 1,
    every_n_train_steps: int | None = None,
    filename: str = "epoch_{epoch:03d}-step_{step:06d}",  # no "=": the path pastes into ckpt_path=
    copy_logs: bool = False,
) -> list[Callback]:
    """The checkpoint callbacks of a run, all writing into ``dirpath``."""
    common: dict[str, Any] = {"dirpath": dirpath, "enable_version_counter": False}
    callbacks: list[Callback] = []
    if save_top_k != 0 and every_n_epochs:
        callbacks.append(
            EpochCheckpoint(
                **common,
                filename=filename,
                monitor=monitor,
                mode=mode,
                save_top_k=save_top_k,
                every_n_epochs=every_n_epochs,
                auto_insert_metric_name=False,
            )
        )
    if save_last:
        # Lightning allows one trigger per ModelCheckpoint; both write the same last.ckpt.
        callbacks.append(LastCheckpoint(**common, filename=_LAST, every_n_epochs=every_n_epochs or 1))
        if every_n_train_steps:
            callbacks.append(
                _StepCheckpoint(
                    **common,
                    filename=_LAST,
                    every_n_train_steps=every_n_train_steps,
                    epoch_end_every=every_n_epochs or 1,
                )
            )
    if not callbacks:
        return []  # save_top_k=0 and save_last=false: the run asked for no checkpoints at all
    callbacks.append(PreemptionCheckpoint(dirpath))
    callbacks.append(TensorBoardSync(dirpath.rstrip("/").rsplit("/", 1)[0] if copy_logs else None))
    return callbacks


class EpochCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint without its per-batch look at step and time triggers it does not have."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._every_n_train_steps < 1 and self._train_time_interval is None:
            return
        super().on_train_batch_end(trainer, pl_module, *args)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores best_model_path from another run's folder too, and deletes it at its first save.
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)

    @functools.cached_property
    def state_key(self) -> str:
        # Lightning formats it at every hook it hands over; it names settings fixed at construction.
        return super().state_key


class LastCheckpoint(EpochCheckpoint):
    """Keeps ``last.ckpt`` (no monitor, one file), also the state training ended in between two
    triggers (``max_steps`` in mid-epoch, ``fast_dev_run``)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        last_ones = (LastCheckpoint, _StepCheckpoint)
        saved = [last_global_step_saved(c) for c in trainer.checkpoint_callbacks if isinstance(c, last_ones)]
        if trainer.global_step not in saved:
            path = f"{str(self.dirpath).rstrip('/')}/{_LAST}{self.FILE_EXTENSION}"
            trainer.save_checkpoint(path, weights_only=False)
            self.best_model_path = path


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """Path of the run's last.ckpt, if one was written."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.filename == _LAST and callback.best_model_path:
            return callback.best_model_path
    return None


def in_an_epochs_last_batch(trainer: L.Trainer) -> bool:
    """Whether fitting is in (or just after) an epoch's last training batch: Lightning resumes a
    checkpoint of this point straight into the next epoch, without this epoch's validation."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.is_last_batch or progress.current.ready >= trainer.num_training_batches


class _StepCheckpoint(EpochCheckpoint):
    """``last.ckpt`` every N optimizer steps, except on an epoch's last batch when the epoch-end one
    follows: resumed from there, a run killed in that epoch's validation would never run it."""

    def __init__(self, *args: Any, epoch_end_every: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_end_every = epoch_end_every

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if in_an_epochs_last_batch(trainer) and (trainer.current_epoch + 1) % self.epoch_end_every == 0:
            return
        super().on_train_batch_end(trainer, pl_module, *args)


class PreemptionCheckpoint(Callback):
    """Saves ``<dirpath>/preempted.ckpt`` on SIGTERM, which Lightning raises between two batches (other
    errors can strike mid-step: a crash resumes from the last regular checkpoint). Not Lightning's
    OnExceptionCheckpoint: its mere presence makes ``fit(ckpt_path=None)`` resume the newest
    ``last*.ckpt``, overriding litlab's decision. A plain Callback: Lightning finds Checkpoints by type."""

    def __init__(self, dirpath: str) -> None:
        self.ckpt_path = f"{dirpath.rstrip('/')}/preempted.ckpt"

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit":
            trainer.save_checkpoint(self.ckpt_path, weights_only=False)  # every rank calls it: a barrier
            if trainer.is_global_zero:
                log.warning(
                    "SIGTERM: saved %s at epoch %d, step %d",
                    self.ckpt_path,
                    trainer.current_epoch,
                    trainer.global_step,
                )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A run that finishes fitting removes its stale preemption checkpoint (teardown does not run
        # when fit raised, so the checkpoint written on SIGTERM stays).
        if stage == "fit" and trainer.is_global_zero:
            trainer.strategy.remove_checkpoint(self.ckpt_path)


class TensorBoardSync(Callback):
    """Flushes TensorBoard with every checkpoint (a killed process loses buffered events) and copies
    its event files to ``<storage_folder>/tensorboard``, for a run resumed on a new machine. Lightning
    logs a step's metrics after its checkpoint, so the copy waits for the next batch, epoch or the end."""

    def __init__(self, storage_folder: str | None) -> None:
        self.storage_folder = storage_folder
        self._pending = False

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self._pending = True
        for logger, _ in self._tensorboard_dirs(trainer):
            logger.experiment.flush()

    def on_fit_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._pending = True
        self._copy_if_pending(trainer)

    def _tensorboard_dirs(self, trainer: L.Trainer) -> list[tuple[TensorBoardLogger, Path]]:
        if not trainer.is_global_zero:
            return []
        return [
            (logger, Path(logger.log_dir))
            for logger in trainer.loggers
            if isinstance(logger, TensorBoardLogger) and Path(logger.log_dir).is_dir()
        ]

    def _copy_if_pending(self, trainer: L.Trainer, *args: Any) -> None:
        if not self._pending or self.storage_folder is None:
            return
        self._pending = False
        for logger, log_dir in self._tensorboard_dirs(trainer):
            logger.experiment.flush()
            events = sorted(log_dir.glob("events.out.tfevents.*"))
            copy_changed_files(events, f"{self.storage_folder}/tensorboard", self.storage_folder)

    on_train_batch_start = on_train_epoch_start = on_exception = _copy_if_pending


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every checkpoint written whole or not at all, a failed write named in one line, and a damaged
    one named in one line when read. Locally: a temporary file beside the target, fsync, a rename
    (Lightning's ``shutil.move`` from the temp folder copies into the name on a mounted drive). On
    object stores: one ``pipe_file``, where Lightning's ``fs.open().write()`` completes a multipart
    upload with the parts that made it. ``last_saved``: the newest checkpoint this process wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.last_saved: tuple[str, int] | None = None  # (url, global step)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        url = str(path)
        folder, name = url.rstrip("/").rsplit("/", 1)
        if folder.endswith("/checkpoints"):  # named as in the run's storage folder
            folder, name = folder.removesuffix("/checkpoints"), f"checkpoints/{name}"
        failure = failed_storage(url)
        if failure is not None:
            raise failure
        step = int(checkpoint.get("global_step", 0))
        # The hang detector counts a write's bytes as progress: a large checkpoint is not a hang.
        with writing(folder, name, url), HEARTBEAT.writing_checkpoint(step):
            if fsspec.utils.get_protocol(url) == "file":
                write_atomic(
                    Path(url.removeprefix("file://")),
                    lambda file: torch.save(checkpoint, CountingWriter(file)),
                    durable=True,
                )
            else:
                buffer = io.BytesIO()
                torch.save(checkpoint, CountingWriter(buffer))
                fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
                HEARTBEAT.uploading(buffer.tell())  # one request, no progress of its own to count
                fs.pipe_file(remote, buffer.getvalue())
        self.last_saved = (url, step)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, *args, **kwargs)
        except RuntimeError as error:  # a tensor record that the resume decision's read does not reach
            if "PytorchStreamReader" not in str(error):
                raise
            raise DamagedCheckpoint(
                f"checkpoint {path} is damaged ({first_line(error)}): move it aside, and the same command "
                "resumes from the one before"
            ) from error


class DamagedCheckpoint(LitlabError):
    """A checkpoint whose tensors cannot be read, found when Lightning loads it."""

    exit_code = EXIT_FAILED


def newest_checkpoint(trainer: L.Trainer) -> tuple[str, int] | None:
    """``(url, global step)`` of the checkpoint the same command resumes from, as this process knows
    it: the newest it wrote (rank 0 writes them all), else the newest of a checkpoint callback without
    a monitor (every rank knows those). None before the first checkpoint."""
    saved = getattr(trainer.strategy.checkpoint_io, "last_saved", None)  # AtomicCheckpointIO's
    if saved is not None:
        return saved
    written = [
        (last_global_step_saved(callback), callback.last_model_path or callback.best_model_path)
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint) and callback.monitor is None
    ]
    step, url = max(((step, url) for step, url in written if url), default=(0, None))
    return (url, step) if url else None


def kept_checkpoint(trainer: L.Trainer) -> str:
    """What a run that failed leaves to resume from, in words (``newest_checkpoint``)."""
    newest = newest_checkpoint(trainer)
    if newest is None:
        return "no checkpoint was written before it"
    return f"the last checkpoint written, {newest[0]} (step {newest[1]}), is intact"


RUN_CONFIG_KEY = "litlab"  # every checkpoint carries its run's config under it (read by litlab-eval)


class RunConfigInCheckpoint(Callback):
    """Stores the run's resolved config and group choices in every checkpoint, so ``litlab-eval`` can
    rebuild the module and datamodule from it alone. Hyperparameters that torch's ``weights_only``
    loading refuses (an optimizer partial, a network) are stored as their text."""

    def __init__(
        self, config: dict[str, Any], choices: dict[str, Any], redact_values: Callable[[Any], Any]
    ) -> None:
        # config: already redacted (litlab.config.redact); redact_values: what does it for the
        # hyperparameters a module saved, which hold the resolved values it was built with.
        self.config, self.choices, self.redact_values = config, choices, redact_values

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[RUN_CONFIG_KEY] = {"config": self.config, "choices": self.choices}
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:
                checkpoint[key] = self.redact_values(_plain(checkpoint[key]))


def _plain(value: Any) -> Any:
    """What torch's weights_only loading accepts; anything else as its text."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def read_run_checkpoint(url: str) -> dict[str, Any]:
    """A litlab checkpoint's contents, its tensors unread (Lightning loads them); a LitlabError if the
    file is not one."""
    try:
        checkpoint = read_checkpoint(url)
    except FileNotFoundError as error:
        raise LitlabError(f"ckpt_path={url} does not exist") from error
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as error:
        raise LitlabError(
            f"ckpt_path={url} is not a readable checkpoint ({first_line(error)}): pass a .ckpt file "
            "that litlab-train wrote, e.g. <run dir>/checkpoints/last.ckpt"
        ) from error
    stored = checkpoint.get(RUN_CONFIG_KEY) if isinstance(checkpoint, dict) else None
    if not stored or not stored.get("config") or "state_dict" not in checkpoint:
        raise LitlabError(
            f"ckpt_path={url} was not written by litlab-train (it holds no run config under "
            f"'{RUN_CONFIG_KEY}'): pass a .ckpt file from a litlab run's checkpoints/ folder"
        )
    return checkpoint
