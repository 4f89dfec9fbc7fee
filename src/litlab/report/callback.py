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
from litlab.report.compare import DEFAULT_BASELINE, CompareError, Report
from litlab.report.render import report_runs
from litlab.run import sweep_record

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """Hydra callback (``hydra.callbacks``): writes the report into the sweep directory when a
    multirun ends, then exits non-zero if any job did not complete (failed, interrupted, or its run
    was running elsewhere), so scripts notice (a pruned Optuna trial ended as its search wanted)."""

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
        if not _has_jobs(sweep_dir):
            # A search whose study already has n_trials (the same command run again): nothing failed.
            self._written = True
            log.info("no job ran in %s: nothing was left to run, so there is no report", sweep_dir)
            return
        report = self._report(sweep_dir)
        if report is None or report.unfinished:
            if report is not None:
                log.error(
                    "%d of %d rows did not complete (failed, interrupted, running elsewhere): see report.md",
                    len(report.unfinished),
                    len(report.rows),
                )
            # Hydra turns an exception raised by a callback into a warning; SystemExit gets through.
            raise SystemExit(1)

    def _report(self, sweep_dir: Path) -> Report | None:
        self._written = True
        try:
            return report_runs([sweep_dir], sweep_dir, baseline=self.baseline, metric=self.metric)
        except CompareError as error:  # says all in one sentence (a bad baseline, an unreadable record)
            log.error("could not write the report of %s: %s", sweep_dir, error)
            return None
        except Exception:
            log.exception("could not write the report of %s", sweep_dir)
            return None

    def _report_if_not_written(self, sweep_dir: Path) -> None:
        if self._written or not sweep_dir.is_dir():  # refused before any job: its one line said why
            return
        if not _has_jobs(sweep_dir):
            log.info("no job of the sweep in %s ended, so there is no report", sweep_dir)
            return
        self._report(sweep_dir)


def _has_jobs(sweep_dir: Path) -> bool:
    """Whether the sweep has a job to report: one its record holds, or (a sweep without a record, as
    before litlab kept one) a job folder."""
    if not sweep_dir.is_dir():
        return False
    record = sweep_record.read(sweep_dir)
    if record is not None:
        return bool(record[0])
    return any(job.is_dir() and is_run_dir(job) for job in sweep_dir.iterdir())
