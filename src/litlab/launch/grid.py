"""The grid sweeper (``hydra/sweeper=grid``, the default): every combination of the swept values, each
job composed, checked and recorded before any starts (docs/sweeps.md). Hydra's ``BasicSweeper`` is
internal, so the product is written out here.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.errors import HydraException
from omegaconf import OmegaConf

from litlab.config.rules import ConfigError
from litlab.errors import one_line
from litlab.launch.multirun import JobPlan, PlanningSweeper, distinct_runs, plan_job
from litlab.run import sweep_record

log = logging.getLogger(__name__)


class GridSweeper(PlanningSweeper):
    """Hydra sweeper: the grid of the swept values, checked whole before any job (module docstring)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})

    def run(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        assert self.config is not None
        swept = [*(f"{key}={value}" for key, value in self.params.items()), *arguments]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        unique, same = distinct_runs(self.plan(swept))
        sweep_record.start(
            sweep_dir, swept, [{"overrides": d.overrides, "same_as": unique.index(f)} for d, f in same]
        )
        for num, plan in enumerate(unique):  # the plan is the record: every job, before any starts
            plan.record(sweep_dir, num)
        for dup, first in same:
            own = " ".join(o for o in dup.overrides if o not in first.overrides) or "the same overrides"
            log.info("job %s (%s) trains the same run as job %s: it runs once", dup.num, own, first.num)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        size = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else len(unique) or 1
        return [
            self.launcher.launch(
                [plan.overrides for plan in unique[start : start + size]], initial_job_idx=start
            )
            for start in range(0, len(unique), size)
        ]

    def plan(self, swept: list[str]) -> list[JobPlan]:
        """Every job of the grid, composed and checked (``multirun.plan_job``)."""
        assert self.config is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        try:
            parsed = parser.parse_overrides(swept)
        except HydraException as error:
            raise ConfigError(one_line(error)) from None
        axes: dict[str, list[str]] = {}  # one axis per key, in command-line order; a later one replaces
        for override in parsed:
            key = override.get_key_element()
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    raise ConfigError(f"{override.input_line}: a grid sweeps lists and ranges, not intervals")
                axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            else:
                axes[key] = [f"{key}={override.get_value_element_as_str()}"]
        return [
            plan_job(self.hydra_context, self.config, list(job), num)
            for num, job in enumerate(itertools.product(*axes.values()))
        ]
