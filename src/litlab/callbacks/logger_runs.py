"""``LoggerRuns``: the run's resolved config as every logger's parameters; W&B runs closed when a run fails.

MLflow, W&B and CSV get the whole redacted config when fitting starts (TensorBoard gets the group
choices with the final metrics: ``litlab.run.loggers``). A failing run finishes its W&B run, so the
next run in this process gets its own.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from litlab.library_internals import wandb_run_started


class LoggerRuns(Callback):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:
            if not isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(self.config)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and wandb_run_started(logger):
                logger.experiment.finish(exit_code=1)
