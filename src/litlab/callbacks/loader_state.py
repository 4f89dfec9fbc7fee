"""Exact resume needs a train loader that restores its position; this says whether it does.

Lightning saves the position of every train loader that has ``state_dict``/``load_state_dict``
(``TensorBatches``, torchdata's ``StatefulDataLoader``, ``litlab.data.ResumableDataLoader``) in each
checkpoint and restores it when a run resumes, so the resumed run sees exactly the batches an
uninterrupted one would. A plain ``torch.utils.data.DataLoader`` restarts its epoch from a fresh
shuffle instead: the run then warns once at start and summary.json says ``resume_exact: false``.

It also repairs one trap for any module: ``trainer.estimated_stepping_batches`` (what a module's
``configure_optimizers`` uses to size a schedule) builds the train loader before a resumed run has
restored its checkpoint, so Lightning never applies the saved position to that loader. When
that happened, the loader is built again, with the saved position, before the first batch.
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
