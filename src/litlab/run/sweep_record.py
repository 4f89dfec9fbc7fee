"""A sweep's own record of its jobs, ``<sweep dir>/.jobs/<job num>.json``, the only thing its report
reads: each job planned, running, then how it ended, with its run's summary as it was then and the
pool's record of the attempt; ``sweep.json`` says which sweep the folder holds (docs/sweeps.md).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import psutil

from litlab.config.redact import redact_overrides, redact_summary
from litlab.config.rules import ConfigError
from litlab.heartbeat import alive
from litlab.run.summary import COMPLETED, INTERRUPTED, RUNNING
from litlab.run.summary import NOT_STARTED as NOT_STARTED  # an outcome too: a job that never started
from litlab.storage.roots import write_text_atomic

RECORD_DIR = ".jobs"
SWEEP_FILE = "sweep.json"
PLANNED, TRAINED, SKIPPED, ELSEWHERE = "planned", "trained", "skipped", "running elsewhere"
_STARTED: set[str] = set()  # the sweep folders whose record this process started


def start(sweep_dir: Path, arguments: list[str], same_runs: list[dict[str, Any]] | None = None) -> None:
    """A sweep of ``arguments`` starts or goes on in ``sweep_dir``; another sweep's folder is refused."""
    previous = read_json(sweep_dir / RECORD_DIR / SWEEP_FILE)
    if previous is not None and previous.get("arguments") != redact_overrides(arguments):
        shown = " ".join(previous.get("arguments") or []) or "no overrides"
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir} holds another sweep ({shown}): give this one its own "
            "hydra.sweep.dir, or move that folder away"
        )
    sweep = {"arguments": redact_overrides(arguments), "same_runs": same_runs or []}
    write_text_atomic(sweep_dir / RECORD_DIR / SWEEP_FILE, json.dumps(sweep, indent=2) + "\n")
    _STARTED.add(str(sweep_dir.absolute()))


def started(sweep_dir: Path) -> bool:
    """Whether this process started the record in ``sweep_dir`` (a refused sweep did not)."""
    return str(Path(sweep_dir).absolute()) in _STARTED


def plan(
    sweep_dir: Path, job_num: int, summary: dict[str, Any], *, run_dir: Path, overrides: list[str]
) -> None:
    """Job ``job_num`` planned, unless an earlier attempt's entry is there (it stays until the job starts)."""
    if not (sweep_dir / RECORD_DIR / f"{job_num}.json").is_file():
        write_job(sweep_dir, job_num, PLANNED, summary, run_dir=run_dir, overrides=overrides)


def write_job(
    sweep_dir: Path,
    job_num: int,
    outcome: str,
    summary: dict[str, Any],
    *,
    run_dir: Path,
    overrides: list[str],
    note: str | None = None,
    pool: dict[str, Any] | None = None,
) -> None:
    """Record job ``job_num``'s ``outcome`` with its run's summary, whose ``sweep`` adds ``pool`` (a skipped
    job's: the training attempt's); a running entry names this process; a replaced one goes in ``earlier``."""
    if outcome == SKIPPED:
        pool = {**_trained_attempt(summary), "skipped": True}
    if pool:
        summary = {**summary, "sweep": {**(summary.get("sweep") or {}), **pool}}
    path = sweep_dir / RECORD_DIR / f"{job_num}.json"
    previous = read_json(path) or {"outcome": PLANNED}
    earlier = previous.pop("earlier", [])
    if previous["outcome"] != PLANNED and previous.get("process") != _this_process():
        earlier.append(previous)  # an earlier attempt's (a running entry of this process is this one's)
    entry = {
        "job_num": job_num,
        "outcome": outcome,
        "note": note,
        "run_dir": str(Path(run_dir).absolute()),
        "overrides": redact_overrides(overrides),
        "summary": redact_summary(summary),
        "process": _this_process() if outcome == RUNNING else None,
        "earlier": earlier,
    }
    write_text_atomic(path, json.dumps(entry, indent=2, default=str) + "\n")


def _trained_attempt(summary: dict[str, Any]) -> dict[str, Any]:
    """The pool's record of the attempt that trained a completed run; {} where that record is gone."""
    sweep = summary.get("sweep") or {}
    entry = read_json(Path(str(sweep.get("dir"))) / RECORD_DIR / f"{sweep.get('job_num')}.json") or {}
    trained = entry.get("summary") or {}
    same = trained.get("started_at") == summary.get("started_at")
    return {k: v for k, v in (trained.get("sweep") or {}).items() if k != "skipped"} if same else {}


def outcome_of(summary: dict[str, Any], job_started_at: str) -> tuple[str, str | None]:
    """Whether the job trained its run or found it completed before it started (local ISO times)."""
    started_at = str(summary.get("started_at") or "")
    if summary.get("status") == COMPLETED and started_at and started_at < job_started_at:
        return SKIPPED, skipped_note(summary)
    return TRAINED, None


def skipped_note(summary: dict[str, Any]) -> str:
    """Where and when a skipped job's run completed."""
    sweep = summary.get("sweep") or {}
    by = f"job {sweep.get('job_num')} of sweep {sweep.get('dir')}" if sweep.get("dir") else "a single run"
    return f"completed earlier ({summary.get('finished_at')}, by {by}); not trained again"


def read(sweep_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The job entries by number (running, watched by a process gone from here: interrupted) and
    ``sweep.json``; None for a folder without a record."""
    record = sweep_dir / RECORD_DIR
    if not record.is_dir():
        return None
    sweep = read_json(record / SWEEP_FILE) or {}  # none under Hydra's own basic sweeper
    entries = sorted(
        (e for e in map(read_json, record.glob("*.json")) if e and "job_num" in e), key=lambda e: e["job_num"]
    )
    for entry in entries:
        process = entry.get("process") or {}
        gone = process.get("host") == socket.gethostname() and not alive(process["pid"], process["started"])
        if entry.get("outcome") == RUNNING and gone:
            why = "the sweep's process ended while the job ran (killed?); the same command resumes it"
            entry["summary"].update(status=INTERRUPTED, error=why)
    return entries, sweep


def list_job(sweep_dir: Path, job_num: int, job_dir: Path) -> None:
    """The relative link ``<sweep dir>/<job num>`` to a job's run folder, for people (not the report)."""
    link = sweep_dir / str(job_num)
    if job_dir.absolute().parent == sweep_dir.absolute():
        return  # the job's folder is in the sweep's folder already
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(job_dir.absolute(), sweep_dir.absolute()), target_is_directory=True)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}
