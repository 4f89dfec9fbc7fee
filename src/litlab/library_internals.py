"""Every use the engine makes of another library's private state, each with why no public API serves.

tests/unit/test_library_internals.py checks each against the installed versions: an upgrade that
changes one fails there, not silently in a run.
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

# torch's multi-tensor ops (what its optimizers and clip_grad_norm_ use): one kernel launch for all
# gradients, where the public per-tensor ops cost a Python call per parameter on every step. Bound
# once here, so the per-step cost is the call alone.
foreach_norm = torch._foreach_norm
foreach_copy_ = torch._foreach_copy_

# Lightning's text table of a model summary: ModelSummary.summarize, the public hook a subclass
# overrides, receives the columns but no formatter; this is the one Lightning's own summarize uses.
format_summary_table = _format_summary_table


def default_store() -> torch.distributed.Store:
    """The store the ranks rendezvoused in. ``init_process_group`` creates it from the launcher's
    address and keeps it; torch offers no public getter for it."""
    return torch.distributed.distributed_c10d._get_default_store()


def default_process_group_backend(device: torch.device) -> str:
    """The backend Lightning picks for a device (nccl for CUDA, gloo otherwise) before its strategy
    has set up the process group (``strategy.process_group_backend`` is None until then)."""
    return _get_default_process_group_backend_for_device(device)


def process_group_timeout(strategy: Any) -> datetime.timedelta | None:
    """The ``timeout`` a DDP strategy was given: the strategy keeps it only privately."""
    return getattr(strategy, "_timeout", None)


def take_child_processes(launcher: Any) -> list[subprocess.Popen]:
    """The rank processes Lightning's subprocess launcher started, out of its observer's sight.

    Beside the ranks it spawns, the launcher starts an observer thread that, when a child fails,
    SIGKILLs every rank and the launching process at its next poll, before anything can say which
    rank failed and why; litlab's ``World`` reports it and ends the ranks instead. Lightning has no
    switch for the observer, but the observer watches the launcher's own public ``procs`` list: the
    launcher gets a copy (its ``kill``, on Ctrl+C, still reaches every child) and the list watched is
    emptied, so the observer finds nothing failed and ends at its next poll. What this relies on (the
    observer is handed that very list) is checked in tests/unit/test_library_internals.py."""
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return []
    watched = launcher.procs
    launcher.procs = list(watched)
    watched.clear()
    return list(launcher.procs)


def raise_sigterm_after_this_batch(trainer: L.Trainer) -> None:
    """Makes Lightning stop as on SIGTERM: it raises ``SIGTERMException`` at the end of the batch in
    progress (after its scheduler step, progress counters and logger saves), or at the epoch's end
    (after the epoch-end checkpoints). Lightning does so only on its own flag
    (``trainer.received_sigterm``, a read-only property); raising the exception from a hook would
    skip that bookkeeping, and ``trainer.should_stop`` runs a validation and ends the fit as finished.
    A write, kept here, because it cannot be done publicly."""
    trainer._signal_connector.received_sigterm = True


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the training batch in progress (or just ended) leaves its gradients accumulated for a
    later optimizer step: a stop there would lose them (no checkpoint holds gradients). Lightning
    decides it in its epoch loop, with its strategy's say on the epoch's last batch; no public API
    tells a callback."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def cluster_environment(trainer: L.Trainer) -> Any:
    """The cluster environment the Trainer detected (SLURMEnvironment under Slurm, with its requeue
    signal). A multi-device strategy has it as ``strategy.cluster_environment``; a single-device
    strategy has none, and only the Trainer's accelerator connector keeps it."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return environment if environment is not None else trainer._accelerator_connector.cluster_environment


def last_global_step_saved(callback: ModelCheckpoint) -> int:
    """The global step at which a ModelCheckpoint last saved (0 before any): the check Lightning's own
    callback uses to skip saving twice at one step. Its public paths say what it saved, not when."""
    return callback._last_global_step_saved


def wandb_run_started(logger: Any) -> bool:
    """Whether a WandbLogger has started its run: its public ``experiment`` property starts one."""
    return logger._experiment is not None


def hydra_job_callbacks(cfg: Any) -> Any:
    """The ``hydra.callbacks`` of ``cfg`` as Hydra calls them around a job. ``litlab.train`` runs one
    job of a config it composed with Hydra's public ``run_job``, whose context wants them; Hydra
    exports no public constructor for them."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(cfg)
