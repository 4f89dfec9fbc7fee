"""Find the runs of sweeps and run directories: each ``RunResult`` is one attempt at a run, as a
sweep's record (``litlab.run.sweep_record``) or a run folder's summary.json holds it. No torch here."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from litlab.run import sweep_record
from litlab.run.summary import COMPLETED, Summary

# Runs of different versions of the user's code differ in this pseudo key: code_fingerprint's first 8 hex.
CODE_KEY = "code"
# Config keys whose value summary.json records as it ran (devices "auto" resolved, a derived micro-batch).
_RECORDED = {
    "trainer.accumulate_grad_batches": "accumulate_grad_batches",
    "trainer.devices": "devices",
    "trainer.num_nodes": "num_nodes",
    "data.batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
    "optimized_metric": "optimized_metric",
    "optimized_metric_mode": "optimized_metric_mode",
}
# Baseline keys may name a summary.json field; they mean the config key the user sweeps.
ALIASES = {name: key for key, name in _RECORDED.items()} | {
    "accumulation": "trainer.accumulate_grad_batches",
    "batch_size": "data.batch_size",
}


class CompareError(ValueError):
    """Bad input to litlab-compare; the message is one sentence."""


class NoRuns(CompareError):
    """A path that holds no run: missing, empty, or a sweep whose record holds no job yet."""


@dataclass
class RunResult:
    """One attempt at a run: its summary, how a sweep's job ended, and its timings (all its attempts'
    once they are counted as one run)."""

    label: str
    dir: Path
    summary: Summary
    outcome: str | None = None  # trained, skipped (completed earlier), running elsewhere, planned, ...
    note: str | None = None  # a skipped job's: where and when its run completed
    # Overrides of the sweep's other jobs that train this same run, so did not run (sweep.json same_runs).
    same_run_overrides: list[list[str]] = field(default_factory=list)
    timings: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Unless given, a completed attempt's timing: ``shared`` with other jobs or runs, ``by`` which start.
        summary, started = self.summary, self.summary.started_at
        throughput, sweep = summary.throughput or {}, summary.sweep or {}
        if self.timings or summary.status != COMPLETED or throughput.get("samples_per_second") is None:
            return
        by = str(sweep.get("timed_by") or sweep.get("dir") or started)  # older records: the sweep folder
        self.timings = [{**throughput, "shared": bool(sweep.get("beside")), "by": by, "started_at": started}]

    @functools.cached_property
    def values(self) -> dict[str, Any]:
        """Each config key's value: overrides, settings, what it recorded, ``code``, groups; the later win."""
        summary = self.summary
        merged = {override_key(o): _typed(o) for o in summary.overrides or []}
        merged.update(summary.settings or {})
        recorded = {key: getattr(summary, name) for key, name in _RECORDED.items()}
        merged.update({key: value for key, value in recorded.items() if value is not None})
        merged[CODE_KEY] = summary.code_fingerprint[:8] if summary.code_fingerprint else None
        return {**merged, **(summary.groups or {})}


@functools.cache
def _typed(override: str) -> Any:
    """An override's value as Hydra reads it (``8``, ``[1, 2]``), or as typed."""
    try:
        return OverridesParser.create().parse_overrides([override])[0].value()
    except Exception:  # Hydra's grammar does not read it back (``data.name=a=b``): the text
        return override.partition("=")[2]


def override_key(override: str) -> str:
    """The key an override sets, aliases resolved; "hydra" for any of Hydra's own."""
    key = override.split("=", 1)[0].lstrip("+~")
    return "hydra" if key.startswith("hydra") else ALIASES.get(key, key)


def collect_runs(paths: Iterable[Path]) -> list[RunResult]:
    """The runs in each path: a sweep's record, a run directory, or a folder of run directories."""
    paths = [Path(p) for p in paths]
    runs: list[RunResult] = []
    for path in paths:
        if not path.is_dir():
            raise NoRuns(f"{path} is not a directory")
        prefix = f"{path.name}/" if len(paths) > 1 else "#"
        record = sweep_record.read(path)
        if record is not None:
            runs.extend(_recorded_runs(path, *record, prefix=prefix))
            continue
        if _is_run_dir(path):
            runs.append(_load_run(path, label=path.name))
            continue
        # resume=never's .replaced-* folders are no runs
        jobs = [d for d in path.iterdir() if d.is_dir() and _is_run_dir(d) and ".replaced-" not in d.name]
        if not jobs:
            raise NoRuns(
                f"{path} is neither a run directory (summary.json) nor a sweep directory (job folders)"
            )
        jobs.sort(key=lambda job: (int(job.name), "") if job.name.isdigit() else (sys.maxsize, job.name))
        runs.extend(_load_run(job, label=f"{prefix}{job.name}") for job in jobs)
    return runs


def _recorded_runs(
    sweep_dir: Path, entries: list[dict[str, Any]], sweep: dict[str, Any], prefix: str
) -> list[RunResult]:
    """The runs of a sweep's jobs as its record holds them, never as their folders are now."""
    if not entries:
        raise NoRuns(f"the sweep in {sweep_dir} has no job in its record yet")
    runs = {}
    for entry in entries:
        try:
            runs[int(entry["job_num"])] = RunResult(
                label=f"{prefix}{entry['job_num']}",
                dir=Path(entry["run_dir"]),
                summary=Summary.from_dict(entry["summary"]),
                outcome=entry.get("outcome"),
                note=entry.get("note"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CompareError(
                f"{sweep_dir / sweep_record.RECORD_DIR} holds a job entry that cannot be read ({error!r})"
            ) from None
    for same in sweep.get("same_runs") or []:
        first = runs.get(same.get("same_as"))
        if first is not None:
            first.same_run_overrides.append(list(same.get("overrides") or []))
    return list(runs.values())


def _is_run_dir(path: Path) -> bool:
    """It has summary.json, or the .hydra/ record a job's process starts with."""
    return (path / "summary.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def _load_run(run_dir: Path, label: str) -> RunResult:
    """A run's summary.json; a job that wrote none is a failed run, as its .hydra/ config says."""
    if (run_dir / "summary.json").is_file():
        return RunResult(label, run_dir, Summary.load(run_dir / "summary.json"))
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")  # _is_run_dir: there
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    hydra = OmegaConf.load(hydra_file).hydra if hydra_file.is_file() else OmegaConf.create()
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if overrides_file.is_file():  # the overrides as typed (hydra.yaml's are the same, resolved)
        hydra.overrides = {"task": OmegaConf.load(overrides_file)}
    error = "no summary.json: the job's process was killed, or it is still running"
    return RunResult(label, run_dir, Summary.of(config, error, run_dir=run_dir, hydra=hydra))
