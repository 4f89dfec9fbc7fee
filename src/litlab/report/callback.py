"""The Hydra callback that ends every multirun with its report (src/litlab/conf/hydra/default.yaml).

Nothing here imports torch or matplotlib at import time: Hydra instantiates the callback in every run.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from litlab.report.collect import is_run_dir
from litlab.report.compare import DEFAULT_BASELINE, Report
from litlab.report.render import report_runs

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """Hydra callback (``hydra.callbacks``): writes the report into the sweep directory when a
    multirun ends, then exits non-zero if any job failed, so scripts notice (a pruned Optuna trial
    is not a failure)."""

    def __init__(
        self, baseline: str = DEFAULT_BASELINE, metric: str | None = None, tasks: Sequence[str] = ("train",)
    ) -> None:
        self.baseline = baseline
        self.metric = metric
        self.tasks = list(tasks)  # task_names whose jobs write summary.json (litlab-eval's do not)
        self._written = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.task_name not in self.tasks:
            return
        # When the sweeper itself gives up (Optuna with every trial failed, a joblib worker killed
        # by the system), Hydra never calls on_multirun_end: report what ran when the process exits.
        atexit.register(self._report_if_not_written, Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.task_name not in self.tasks:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir() or not any(job.is_dir() and is_run_dir(job) for job in sweep_dir.iterdir()):
            # A search whose study already has n_trials (the same command run again): nothing failed.
            self._written = True
            log.info("no job ran in %s: nothing was left to run, so there is no report", sweep_dir)
            return
        report = self._report(sweep_dir)
        if report is None or report.failed:
            if report is not None:
                log.error("%d of %d jobs failed (see report.md)", len(report.failed), report.run_count)
            # Hydra turns an exception raised by a callback into a warning; SystemExit gets through.
            raise SystemExit(1)

    def _report(self, sweep_dir: Path) -> Report | None:
        self._written = True
        try:
            return report_runs([sweep_dir], sweep_dir, baseline=self.baseline, metric=self.metric)
        except Exception:
            log.exception("could not write the report of %s", sweep_dir)
            return None

    def _report_if_not_written(self, sweep_dir: Path) -> None:
        if not self._written and sweep_dir.is_dir():
            self._report(sweep_dir)
