"""The Hydra callback that ends every multirun with its report (src/litlab/conf/hydra/default.yaml).
Hydra instantiates it in every run, so nothing here imports torch or matplotlib at import time."""

from __future__ import annotations

import atexit
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from litlab.errors import EXIT_FAILED
from litlab.report.collect import CompareError, NoRuns
from litlab.report.compare import DEFAULT_BASELINE
from litlab.report.render import report_runs
from litlab.run import sweep_record

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """Writes the report into the sweep directory when a multirun ends, then exits 1 if a job did not
    complete, so scripts notice."""

    def __init__(
        self, baseline: str = DEFAULT_BASELINE, metric: str | None = None, tasks: Sequence[str] = ("train",)
    ) -> None:
        self.baseline = baseline
        self.metric = metric
        self.tasks = list(tasks)  # task_names whose jobs write summary.json (litlab-eval's do not)
        self._written = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.task_name in self.tasks:
            # When the sweep ends otherwise (SIGTERM, Optuna with every trial failed, a joblib worker
            # killed by the system), Hydra never calls on_multirun_end: report what ran at the exit.
            atexit.register(self._report_at_exit, Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, stopped: str | None = None, **kwargs: Any) -> None:
        """``stopped``: why the sweep stopped before its end (its sweeper's error)."""
        # Hydra turns an exception raised by a callback into a warning; SystemExit gets through.
        if config.task_name in self.tasks and not self._report(Path(config.hydra.sweep.dir), stopped):
            raise SystemExit(EXIT_FAILED)

    def _report_at_exit(self, sweep_dir: Path) -> None:
        # A sweep refused before it started its record (its one line said why) has no report.
        if not self._written and sweep_record.started(sweep_dir):
            self._report(sweep_dir)

    def _report(self, sweep_dir: Path, stopped: str | None = None) -> bool:
        """Write the sweep's report; False where a row did not complete or no report could be written."""
        self._written = True
        try:
            report = report_runs([sweep_dir], sweep_dir, self.baseline, self.metric, stopped)
        except NoRuns:  # failed nothing (a search whose study already has n_trials, run again)
            log.info("no job ran to its end in %s, so there is no report", sweep_dir)
            return True
        except CompareError as error:  # says all in one sentence (a bad baseline, an unreadable record)
            log.error("could not write the report of %s: %s", sweep_dir, error)
            return False
        except Exception:
            log.exception("could not write the report of %s", sweep_dir)
            return False
        if report.unfinished:
            log.error(report.unfinished_line(sweep_dir / "report.md"))
        return not report.unfinished
