"""Lightning's, torch's and Hydra's private state that the engine reads or writes, each with why no
public API serves; tests/unit/test_library_internals.py checks each against the installed versions.
Uses that extend a library's class or drive its client stay beside their code and tests:
``storage.checkpoints.EpochCheckpoint`` (ModelCheckpoint's triggers), ``storage.gcs_bounded`` (gcsfs's
retried requests), Optuna's study storage (``launch.search``, ``callbacks.pruning``).
"""

from __future__ import annotations

import datetime
import subprocess
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.distributed import _get_default_process_group_backend_for_device
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

# torch's multi-tensor ops (what its optimizers use): one kernel launch for all gradients, where the
# public per-tensor ops cost a Python call per parameter on every step.
foreach_norm = torch._foreach_norm
foreach_copy_ = torch._foreach_copy_
# Lightning's text table of a model summary: ModelSummary.summarize, the public hook a subclass
# overrides, receives the columns but no formatter; this is the one Lightning's own summarize uses.
format_summary_table = _format_summary_table
# The backend Lightning picks for a device (nccl for CUDA, else gloo) before its strategy has set up
# the process group (``strategy.process_group_backend`` is None until then).
default_process_group_backend = _get_default_process_group_backend_for_device


def default_store() -> torch.distributed.Store:
    """The store the ranks rendezvoused in: ``init_process_group`` keeps it, torch has no public getter."""
    return torch.distributed.distributed_c10d._get_default_store()


def process_group_timeout(strategy: Any) -> datetime.timedelta | None:
    """The ``timeout`` a DDP strategy was given: the strategy keeps it only privately."""
    return getattr(strategy, "_timeout", None)


def take_child_processes(launcher: Any) -> list[subprocess.Popen]:
    """The rank processes Lightning's subprocess launcher started, out of its observer's sight (which
    SIGKILLs every rank when one fails, before ``World`` can say which and why; Lightning has no switch
    for it). The observer watches
    the list ``launcher.procs`` was: the launcher gets a copy (its ``kill`` on Ctrl+C still reaches
    every child) and the watched list is emptied, so the observer finds nothing failed and ends."""
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return []
    watched = launcher.procs
    launcher.procs = list(watched)
    watched.clear()
    return list(launcher.procs)


def raise_sigterm_after_this_batch(trainer: L.Trainer) -> None:
    """Makes Lightning stop as on SIGTERM, at the end of the batch in progress (after its bookkeeping)
    or of the epoch (after its checkpoints). ``trainer.received_sigterm`` is read-only; raising from a
    hook would skip that bookkeeping, and ``trainer.should_stop`` validates and ends as finished."""
    trainer._signal_connector.received_sigterm = True


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the training batch in progress (or just ended) leaves its gradients for a later optimizer
    step: Lightning's epoch loop decides it; no public API tells a callback."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def cluster_environment(trainer: L.Trainer) -> Any:
    """The detected cluster environment: a single-device strategy has none, only the accelerator
    connector keeps it."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return environment if environment is not None else trainer._accelerator_connector.cluster_environment


def last_global_step_saved(callback: ModelCheckpoint) -> int:
    """The global step at which a ModelCheckpoint last saved (0 before any), as Lightning's own check
    against saving twice at one step; its public paths say what it saved, not when."""
    return callback._last_global_step_saved


def wandb_run_started(logger: Any) -> bool:
    """Whether a WandbLogger has started its run: its public ``experiment`` property starts one."""
    return logger._experiment is not None


def hydra_job_callbacks(cfg: Any) -> Any:
    """The ``hydra.callbacks`` of ``cfg`` as Hydra calls them around a job: its public ``run_job``
    wants them, and Hydra exports no public constructor for them."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(cfg)
