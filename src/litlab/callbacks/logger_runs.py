"""The run's resolved config as every logger's parameters, and W&B runs closed when a run fails.

Lightning logs only what a module passes to ``save_hyperparameters``; MLflow, W&B and CSV get the
whole resolved config here when fitting starts (TensorBoard gets the group choices with the final
metrics, in its HParams tab: ``litlab.run.loggers``). W&B keeps one run per process until it is
finished, and Lightning never finishes it: a run that fails finishes its W&B run here (exit code 1),
so that the next run in this process (a sweep's next job) gets its own.
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
