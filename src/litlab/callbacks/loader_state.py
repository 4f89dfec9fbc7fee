"""Exact resume needs a train loader that restores its position: ``ResumableLoaderCheck`` says if it does.

A loader without ``state_dict``/``load_state_dict`` restarts its epoch on resume: the run warns once
and summary.json says ``resume_exact: false``. It also rebuilds the train loader with its saved
position when ``trainer.estimated_stepping_batches`` built it before the checkpoint was restored.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader

from litlab.library_internals import rebuild_train_loader, train_loader_states_pending

log = logging.getLogger("litlab")


def restores_position(loader: Any) -> bool:
    """Whether Lightning can save and restore this loader's position (its ``_Stateful`` check)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


class RunRecord(Protocol):
    """Where the check records whether resume is exact (``litlab.run.lifecycle.Run``)."""

    resume_exact: bool | None


class ResumableLoaderCheck(Callback):
    def __init__(self, run: RunRecord | None = None) -> None:
        self.run = run

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        iterables = trainer.train_dataloader
        if iterables is None:
            return
        if train_loader_states_pending(trainer):
            # The loader was built before the checkpoint was restored (estimated_stepping_batches in
            # configure_optimizers): the epoch's setup builds it again, with the saved position.
            rebuild_train_loader(trainer)
        loaders = CombinedLoader(iterables).flattened
        exact = all(restores_position(loader) for loader in loaders)
        if self.run is not None:
            self.run.resume_exact = exact
        if not exact and trainer.is_global_zero:
            kinds = ", ".join(sorted({type(loader).__name__ for loader in loaders}))
            log.warning(
                "resume is not exact: the train loader (%s) cannot restore its position, so a resumed run "
                "restarts its epoch from a new shuffle; return a litlab.data.ResumableDataLoader or "
                "TensorBatches from train_dataloader() (summary.json: resume_exact false)",
                kinds,
            )
