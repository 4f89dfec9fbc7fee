"""Find the runs under sweep and run directories, and read each one's summary.json.

A job folder without a summary.json (its process was killed, or it still runs) becomes a failed
run whose figures are what its config says (``Summary.of_config``). Nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from litlab.config.redact import typed_overrides
from litlab.run.summary import FAILED, Summary


class CompareError(ValueError):
    """Bad input to litlab-compare; the message is one sentence."""


@dataclass
class RunResult:
    """One run directory: its summary and its config (``.hydra/config.yaml`` as composed)."""

    label: str
    dir: Path
    summary: Summary
    config: DictConfig | None

    @property
    def completed(self) -> bool:
        return self.summary.completed


def collect_runs(paths: Iterable[Path]) -> list[RunResult]:
    """The runs in each path: a run directory (summary.json or .hydra/) or a sweep directory."""
    paths = [Path(p) for p in paths]
    runs: list[RunResult] = []
    for path in paths:
        if not path.is_dir():
            raise CompareError(f"{path} is not a directory")
        if is_run_dir(path):
            runs.append(load_run(path, label=path.name))
            continue
        jobs = sorted((d for d in path.iterdir() if d.is_dir() and is_run_dir(d)), key=_job_order)
        if not jobs:
            raise CompareError(
                f"{path} is neither a run directory (summary.json) nor a sweep directory (job folders)"
            )
        prefix = f"{path.name}/" if len(paths) > 1 else "#"
        runs.extend(load_run(job, label=f"{prefix}{job.name}") for job in jobs)
    return runs


def is_run_dir(path: Path) -> bool:
    """A run's or a job's folder: it has summary.json, or the .hydra/ record its process starts with."""
    return (path / "summary.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def _job_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (sys.maxsize, path.name)


def load_run(run_dir: Path, label: str) -> RunResult:
    """A run's summary.json and config; a job that wrote no summary.json is a failed run."""
    candidates = (run_dir / ".hydra" / "config.yaml", run_dir / "config.yaml")
    config = next((OmegaConf.load(p) for p in candidates if p.is_file()), None)
    summary_path = run_dir / "summary.json"
    summary = Summary.load(summary_path) if summary_path.is_file() else _stand_in(run_dir, config)
    return RunResult(label=label, dir=run_dir, summary=summary, config=config)


def _stand_in(run_dir: Path, config: DictConfig | None) -> Summary:
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    hydra = OmegaConf.load(hydra_file).hydra if hydra_file.is_file() else OmegaConf.create()
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    choices: dict[str, Any] = OmegaConf.to_container(hydra.runtime.choices) if "runtime" in hydra else {}
    return Summary.of_config(
        config if config is not None else OmegaConf.create(),
        FAILED,
        "no summary.json: the job's process was killed, or it is still running",
        run_dir=run_dir,
        choices=choices,
        overrides=typed_overrides(OmegaConf.load(overrides_file)) if overrides_file.is_file() else [],
    )
