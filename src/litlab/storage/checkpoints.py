"""Checkpoints: what a run writes, how, what it carries, and which one the same command resumes from.

- ``run_checkpoints``: src/litlab/conf/callbacks/checkpoint.yaml as callbacks: the best ``save_top_k``,
  ``last.ckpt`` (a ModelCheckpoint of its own: Lightning's ``save_last`` goes stale once the metric
  stops improving), and preempted.ckpt on SIGTERM (``PreemptionCheckpoint``); ``TensorBoardSync``
  keeps TensorBoard's curves with them.
- ``AtomicCheckpointIO``: every write all-or-nothing; a failed one is ``StorageFailed``, one line.
- ``newest_checkpoint``: the one place that says which checkpoint a stopped run resumes from.
- ``RunConfigInCheckpoint`` / ``read_run_checkpoint``: the run's config inside each checkpoint, for
  ``litlab-eval``. docs/storage.md.
"""

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

from litlab.errors import LitlabError
from litlab.heartbeat import HEARTBEAT, CountingWriter
from litlab.library_internals import last_global_step_saved
from litlab.storage.roots import (
    copy_changed_files,
    failed_storage,
    read_checkpoint,
    write_atomic,
    writing,
)

log = logging.getLogger(__name__)

LAST = "last"
PREEMPTED = "preempted"


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
        callbacks.append(
            LastCheckpoint(**common, filename=LAST, every_n_epochs=every_n_epochs or 1, final=True)
        )
        if every_n_train_steps:
            callbacks.append(
                StepCheckpoint(
                    **common,
                    filename=LAST,
                    every_n_train_steps=every_n_train_steps,
                    epoch_end_every=every_n_epochs or 1,
                )
            )
    if not callbacks:
        return []  # save_top_k=0 and save_last=false: the run asked for no checkpoints at all
    callbacks.append(PreemptionCheckpoint(dirpath, filename=PREEMPTED))
    storage_folder = dirpath.rstrip("/").rsplit("/", 1)[0]
    callbacks.append(TensorBoardSync(f"{storage_folder}/tensorboard" if copy_logs else None))
    return callbacks


class EpochCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, which looks at its step and time triggers after every training
    batch; with neither (``every_n_train_steps``, ``train_time_interval``) it has nothing to look at
    there, and skips the calls that look (Lightning returns after them too; docs/performance.md)."""

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
    """Keeps ``last.ckpt`` (no monitor, one file). With ``final``, it also writes the final state when
    training ends between two triggers (``max_steps`` in mid-epoch, ``fast_dev_run``), so last.ckpt is
    always the state training ended in."""

    def __init__(self, *args: Any, final: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.final = final

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        saved = [
            last_global_step_saved(c) for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)
        ]
        if self.final and trainer.global_step not in saved:
            path = f"{str(self.dirpath).rstrip('/')}/{LAST}{self.FILE_EXTENSION}"
            trainer.save_checkpoint(path, weights_only=False)
            self.best_model_path = path


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """Path of the run's last.ckpt, if one was written."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.filename == LAST and callback.best_model_path:
            return callback.best_model_path
    return None


def in_an_epochs_last_batch(trainer: L.Trainer) -> bool:
    """Whether fitting is in (or just after) the last training batch of an epoch. A checkpoint of
    this point is resumed by Lightning straight into the next epoch, without this epoch's validation."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.is_last_batch or progress.current.ready >= trainer.num_training_batches


class StepCheckpoint(LastCheckpoint):
    """``last.ckpt`` every N optimizer steps, except on an epoch's last batch when the epoch-end
    ``last.ckpt`` follows (every ``epoch_end_every`` epochs).

    Why: Lightning resumes a checkpoint written on an epoch's last batch straight into the next epoch
    (loops/training_epoch_loop.py, ``reset``), so a run killed during that epoch's validation would
    never run it: its val metrics and its epoch-end checkpoint would be missing from a run reported
    as completed. Without that checkpoint, the kill resumes from the one before, replays the last
    batches (exactly: the loaders resume) and validates."""

    def __init__(self, *args: Any, epoch_end_every: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_end_every = epoch_end_every

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if in_an_epochs_last_batch(trainer) and (trainer.current_epoch + 1) % self.epoch_end_every == 0:
            return
        super().on_train_batch_end(trainer, pl_module, *args)


class PreemptionCheckpoint(Callback):
    """Saves ``<dirpath>/<filename>.ckpt`` when the process receives SIGTERM, then lets it exit.

    Lightning raises SIGTERMException between two batches, so the state saved here is consistent.
    Other exceptions are left alone: they can strike in the middle of a step, and a run that crashed
    should resume from its last regular checkpoint, not from a half-updated state. Written instead of
    using Lightning's OnExceptionCheckpoint because that one saves on every exception and, merely by
    being present, turns ``fit(ckpt_path=None)`` into a silent resume from the newest ``last*.ckpt``,
    which would override litlab's resume decision (``resume=never``, a corrupt file skipped). A plain
    Callback, not a Checkpoint: Lightning looks for those by type (``trainer.checkpoint_callback``,
    "best"), and litlab runs plain ones combined (``litlab.callbacks.combined``).
    """

    def __init__(self, dirpath: str, filename: str = PREEMPTED) -> None:
        self.dirpath, self.filename = dirpath, filename

    @property
    def ckpt_path(self) -> str:
        return f"{self.dirpath.rstrip('/')}/{self.filename}.ckpt"

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
    """Flushes TensorBoard with every checkpoint, and optionally copies its event files to storage.

    The flush makes the curves on disk reach the checkpoint a resumed run starts from (TensorBoard
    buffers events in memory, and a killed process loses them). With ``destination`` (a storage root
    that outlives the machine: mounted drive, S3, GCS), the event files are copied there, so a run
    resumed on a new machine restores them and continues the same curves. Lightning logs a step's
    metrics after that step's checkpoint, so the copy waits for the next batch (or epoch, exception,
    end of fit): a kill in between leaves the restored curve without that one step.
    """

    def __init__(self, destination: str | None = None) -> None:
        self.destination = destination
        self.storage_folder = destination.rstrip("/").rsplit("/", 1)[0] if destination else None
        self._pending = False

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self._pending = True
        self._flush(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._copy_if_pending(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._copy_if_pending(trainer)

    def on_exception(self, trainer: L.Trainer, *args: Any) -> None:
        self._copy_if_pending(trainer)

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

    def _flush(self, trainer: L.Trainer) -> None:
        for logger, _ in self._tensorboard_dirs(trainer):
            logger.experiment.flush()

    def _copy_if_pending(self, trainer: L.Trainer) -> None:
        if not self._pending or self.destination is None:
            return
        self._pending = False
        for logger, log_dir in self._tensorboard_dirs(trainer):
            logger.experiment.flush()
            events = sorted(log_dir.glob("events.out.tfevents.*"))
            copy_changed_files(events, self.destination, self.storage_folder)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every checkpoint written whole or not at all, and a failed write named in one line.

    Locally: torch.save into a temporary file next to the target, fsync, then rename over it.
    Lightning's own local save goes through a temporary file in the system temp folder and
    ``shutil.move``: on a mounted drive (another device) that is a copy into the final name, which a
    kill or a full disk can truncate. On object stores: one ``pipe_file`` (a single PUT, or a multipart
    upload that s3fs aborts when a part fails), where Lightning's ``fs.open(...).write()`` would
    complete a multipart upload with the parts that made it. ``last_saved`` is the newest checkpoint
    this process wrote: what a run that fails afterwards resumes from.
    """

    def __init__(self) -> None:
        super().__init__()
        self.last_saved: tuple[str, int] | None = None  # (url, global step)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        url = str(path)
        folder, name = _storage_folder_and_name(url)
        failure = failed_storage(url)
        if failure is not None:
            raise failure
        step = int(checkpoint.get("global_step", 0))
        # The hang detector counts a write's bytes as progress: a large checkpoint is not a hang.
        with writing(folder, name, url), HEARTBEAT.writing_checkpoint(step):
            if fsspec.utils.get_protocol(str(path)) == "file":
                write_atomic(
                    Path(url.removeprefix("file://")),
                    lambda file: torch.save(checkpoint, CountingWriter(file)),
                    binary=True,
                    durable=True,
                )
            else:
                buffer = io.BytesIO()
                torch.save(checkpoint, CountingWriter(buffer))
                fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
                HEARTBEAT.uploading(buffer.tell())  # one request, no progress of its own to count
                fs.pipe_file(remote, buffer.getvalue())
        self.last_saved = (url, int(checkpoint.get("global_step", 0)))


def _storage_folder_and_name(url: str) -> tuple[str, str]:
    """``(<root>/<identity>, checkpoints/<file>)`` for a checkpoint in a run's storage folder."""
    folder, file = url.rstrip("/").rsplit("/", 1)
    if folder.endswith("/checkpoints"):
        return folder.removesuffix("/checkpoints"), f"checkpoints/{file}"
    return folder, file


def newest_checkpoint(trainer: L.Trainer) -> tuple[str, int] | None:
    """``(url, global step)`` of the checkpoint the same command resumes from, as this process knows
    it: the newest it wrote (global rank 0 writes them all, preempted.ckpt included), else the newest
    file of a checkpoint callback without a monitor (every rank knows those; ``trainer.checkpoint_callback``
    alone is the first callback, often a monitoring one). None before the first checkpoint."""
    saved = getattr(getattr(trainer.strategy, "checkpoint_io", None), "last_saved", None)
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


# The key under which every checkpoint carries its run's config (read by litlab-eval).
RUN_CONFIG_KEY = "litlab"
# What torch's weights_only loading accepts in hyper_parameters; anything else is stored as text.
_PLAIN = (str, int, float, bool, type(None))


class RunConfigInCheckpoint(Callback):
    """Stores the run's resolved config and group choices in every checkpoint, so ``litlab-eval``
    can rebuild the module and datamodule from a checkpoint alone, for any task.

    It also keeps checkpoints loadable with torch's safe ``weights_only=True`` (resume and eval load
    them that way) whatever a module passes to ``save_hyperparameters``: an optimizer partial, a
    network or an omegaconf object there would make the file unloadable, so such values are stored
    as their text (Lightning reads them back only in ``load_from_checkpoint``).
    """

    def __init__(
        self,
        config: dict[str, Any],
        choices: dict[str, Any],
        redact_values: Callable[[Any], Any] | None = None,
    ) -> None:
        # config: already redacted (litlab.config.redact); redact_values: what does it for the
        # hyperparameters a module saved, which hold the resolved values it was built with.
        self.config, self.choices = config, choices
        self.redact_values = redact_values or (lambda value: value)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[RUN_CONFIG_KEY] = {"config": self.config, "choices": self.choices}
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:
                checkpoint[key] = self.redact_values(_plain(checkpoint[key]))


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def read_run_checkpoint(url: str) -> dict[str, Any]:
    """A litlab checkpoint's contents; a LitlabError if the file is not one."""
    try:
        checkpoint = read_checkpoint(url)
    except FileNotFoundError as error:
        raise LitlabError(f"ckpt_path={url} does not exist") from error
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise LitlabError(
            f"ckpt_path={url} is not a readable checkpoint ({first}): pass a .ckpt file "
            "that litlab-train wrote, e.g. <run dir>/checkpoints/last.ckpt"
        ) from error
    stored = checkpoint.get(RUN_CONFIG_KEY) if isinstance(checkpoint, dict) else None
    if not stored or not stored.get("config") or "state_dict" not in checkpoint:
        raise LitlabError(
            f"ckpt_path={url} was not written by litlab-train (it holds no run config under "
            f"'{RUN_CONFIG_KEY}'): pass a .ckpt file from a litlab run's checkpoints/ folder"
        )
    return checkpoint
