"""Exact resume needs a train loader that restores its position: ``ResumableLoaderCheck`` says if it does;
where it does not, the run warns once and summary.json says ``resume_exact: false``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader

from litlab.errors import LitlabError

log = logging.getLogger("litlab")


def _restores_position(loader: Any) -> bool:  # Lightning's _Stateful check
    return all(callable(getattr(loader, name, None)) for name in ("state_dict", "load_state_dict"))


def _takes_position_at_first_batch(loader: Any) -> bool:
    """Whether a position loaded after ``iter(loader)`` still counts: ``__iter__`` is a generator function,
    and it has a length (Lightning draws a batch ahead, at ``iter()``, from a loader without one)."""
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return inspect.isgeneratorfunction(type(loader).__iter__)


class ResumableLoaderCheck(Callback):
    """Records in ``run.resume_exact`` whether resume is exact. Lightning skips giving the train loaders
    their saved positions when ``trainer.estimated_stepping_batches`` built them before the checkpoint
    was restored: at train start this gives every loader that takes its position at its first batch its
    saved one (idempotent where Lightning already did); one that took it when built cannot get it."""

    def __init__(self, run: Any) -> None:  # litlab.run.lifecycle.Run
        self.run = run
        self.positions: list[dict[str, Any]] = []
        self.built_before_restore = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.positions, self.built_before_restore = [], False

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # One per loader that restores a position, as Lightning's fit loop saves them.
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self.positions = list(fit_loop.get("state_dict", {}).get("combined_loader", []))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After configure_optimizers, before Lightning restores the loops' state from the checkpoint.
        self.built_before_restore = trainer.train_dataloader is not None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        iterables = trainer.train_dataloader
        if iterables is None:
            return
        loaders = CombinedLoader(iterables).flattened
        exact = all(_restores_position(loader) for loader in loaders)
        kinds = ", ".join(sorted({type(loader).__name__ for loader in loaders}))
        # Lightning loads the positions only into a fit that restarts (not one resumed after an epoch
        # that had finished): the same condition.
        why = "cannot restore its position, so a resumed run restarts its epoch from a new shuffle"
        if exact and self.positions and trainer.fit_loop.restarting:
            exact = self._give_saved_positions(loaders)  # every one restores its position
            why = (
                "was built before the checkpoint was restored (trainer.estimated_stepping_batches in "
                "configure_optimizers) and took its position then, so this epoch restarts"
            )
        if not exact and trainer.is_global_zero:
            log.warning(
                "resume is not exact: the train loader (%s) %s; return a litlab.data.ResumableDataLoader or "
                "TensorBatches from train_dataloader() (summary.json: resume_exact false)",
                kinds,
                why,
            )
        self.positions = []  # released: a checkpoint's positions can be large (workers' states)
        self.run.resume_exact = exact

    def _give_saved_positions(self, loaders: list[Any]) -> bool:
        """False where a loader built before the restore cannot take its position."""
        if len(loaders) != len(self.positions):
            raise LitlabError(
                f"the checkpoint holds the positions of {len(self.positions)} train loader(s) and "
                f"train_dataloader() returned {len(loaders)} that restore one: resume with the train "
                "loaders the checkpoint was written with"
            )
        late = [_takes_position_at_first_batch(loader) for loader in loaders]
        for loader, position, takes_it in zip(loaders, self.positions, late, strict=True):
            if takes_it:
                loader.load_state_dict(position)
        return all(late) or not self.built_before_restore
