"""``TrialPruning``: an Optuna trial that is going nowhere stops after the validation that shows it
(summary.json ``status: pruned``, exit 0); added where ``LITLAB_OPTUNA_TRIAL`` is set (by
``litlab.launch.search``)."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from litlab.config.pruners import database_error, engine_kwargs, make_pruner, quiet_optuna

log = logging.getLogger("litlab")


class TrialPruning(Callback):
    """Global rank 0 reports ``metric`` to the trial after every validation and broadcasts its pruner's
    decision, so every rank stops together (``run.extra["pruned_epoch"]`` then tells
    ``litlab.run.lifecycle`` the run was pruned). A database that does not answer (a restart, an outage)
    warns once; the run trains on and reports again at its next validation."""

    def __init__(self, metric: str, spec: dict[str, Any], run: Any) -> None:  # run: litlab.run.lifecycle.Run
        self.metric = metric
        self.spec = spec
        self.run = run
        self.trial: Any = None  # optuna.trial.Trial, on global rank 0 once reached
        self.warned = False

    def _connect(self) -> Any:
        import optuna

        quiet_optuna()
        url = self.spec["storage"]
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
        study = optuna.load_study(
            study_name=self.spec["study"], storage=storage, pruner=make_pruner(self.spec["pruner"])
        )
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, self.spec["trial"])
        return optuna.trial.Trial(study, trial_id)

    def _should_prune(self, trainer: L.Trainer) -> bool:
        value = trainer.callback_metrics.get(self.metric)
        if value is None:
            return False
        try:
            self.trial = self.trial or self._connect()
            self.trial.report(float(value), step=trainer.current_epoch)
            return bool(self.trial.should_prune())
        except Exception as error:  # the run matters more than its pruning: it trains on
            if not self.warned:  # once: a database restarting fails every report until it is back
                self.warned = True
                log.warning(
                    "Optuna trial %s: %s not reported (%s): the run is not pruned while the study's "
                    "database does not answer, and trains on",
                    self.spec.get("trial"),
                    self.metric,
                    database_error(error),
                )
            return False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        prune = self._should_prune(trainer) if trainer.is_global_zero else False
        prune = bool(trainer.strategy.broadcast(prune, src=0))  # every rank stops at the same point
        if prune:
            trainer.should_stop = True
            self.run.extra["pruned_epoch"] = trainer.current_epoch
            value = trainer.callback_metrics.get(self.metric)
            log.info(
                "Optuna trial %s pruned at epoch %d (%s = %s): the run stops here",
                self.spec.get("trial"),
                trainer.current_epoch,
                self.metric,
                f"{float(value):.4g}" if value is not None else "not logged",
            )
