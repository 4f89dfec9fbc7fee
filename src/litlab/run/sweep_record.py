"""A sweep's own record of its jobs: ``<sweep dir>/.jobs/<job num>.json``, the only thing its report reads.

Each entry holds the job's overrides, the run folder it linked, the run's summary as it was when the
job ended (its ``sweep`` with the device pool's own record of the job: its devices, start, end, the
jobs beside it, its command; the pool never writes into a run's summary.json), and its ``outcome``:
this sweep trained it, skipped it (completed earlier), found it running elsewhere, or never started
it. A later sweep, a later ``resume=never`` of the same runs, or moving the folder leaves the record,
and so the report, as it was. ``sweep.json`` says which sweep the folder holds (its arguments) and
which jobs were one run. One file per job: jobs of a Slurm array end in processes of their own.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from litlab.config.redact import redact_overrides, redact_summary
from litlab.config.rules import ConfigError
from litlab.run.summary import COMPLETED
from litlab.storage.roots import write_text_atomic

RECORD_DIR = ".jobs"
SWEEP_FILE = "sweep.json"
TRAINED, SKIPPED, ELSEWHERE, NOT_STARTED = "trained", "skipped", "running elsewhere", "not started"


def start(sweep_dir: Path, arguments: list[str], same_runs: list[dict[str, Any]] | None = None) -> None:
    """A sweep of ``arguments`` starts in ``sweep_dir``. A folder that holds another sweep is refused
    (ConfigError): two sweeps' jobs would mix. The same sweep again (``hydra.sweep.dir`` set, the
    command re-run) starts its record afresh: its jobs' entries, links and refused folders go, and
    each job is recorded anew (skipped where its run completed)."""
    record = sweep_dir / RECORD_DIR
    previous = read_json(record / SWEEP_FILE)
    if previous is not None and previous.get("arguments") != redact_overrides(arguments):
        shown = " ".join(previous.get("arguments") or []) or "no overrides"
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir} holds another sweep ({shown}): give this one its own "
            "hydra.sweep.dir, or move that folder away"
        )
    if record.is_dir():
        shutil.rmtree(record)
        for entry in sweep_dir.iterdir():
            if entry.name.isdigit():  # a job's link to its run folder, or a refused job's folder
                entry.unlink() if entry.is_symlink() else shutil.rmtree(entry)
    sweep = {"arguments": redact_overrides(arguments), "same_runs": same_runs or []}
    write_text_atomic(record / SWEEP_FILE, json.dumps(sweep, indent=2) + "\n")


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
    """Record how job ``job_num`` ended (``outcome``), with its run's summary as it is now; the copy's
    ``sweep`` adds ``pool``, the device pool's record of the job (``devices``, ``start``, ``end``,
    ``beside``, ``command``). A skipped job's copy says ``sweep.skipped: true`` instead; its
    ``sweep.dir`` names the sweep that trained it."""
    added = {"skipped": True} if outcome == SKIPPED else pool
    if added:
        summary = {**summary, "sweep": {**(summary.get("sweep") or {}), **added}}
    entry = {
        "job_num": job_num,
        "outcome": outcome,
        "note": note,
        "run_dir": str(Path(run_dir).absolute()),
        "overrides": redact_overrides(overrides),
        "summary": redact_summary(summary),
    }
    path = sweep_dir / RECORD_DIR / f"{job_num}.json"
    write_text_atomic(path, json.dumps(entry, indent=2, default=str) + "\n")


def outcome_of(summary: dict[str, Any], job_started_at: str) -> tuple[str, str | None]:
    """Whether the job's process trained the run whose summary it left, or found it completed
    before it started (``started_at`` is local ISO time to the second, as summary.json writes it)."""
    started = str(summary.get("started_at") or "")
    if summary.get("status") == COMPLETED and started and started < job_started_at:
        return SKIPPED, skipped_note(summary)
    return TRAINED, None


def skipped_note(summary: dict[str, Any]) -> str:
    """Where and when a skipped job's run completed."""
    sweep = summary.get("sweep") or {}
    by = f"job {sweep.get('job_num')} of sweep {sweep.get('dir')}" if sweep.get("dir") else "a single run"
    return f"completed earlier ({summary.get('finished_at')}, by {by}); not trained again"


def read(sweep_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The job entries of the sweep in ``sweep_dir`` (by job number) and its ``sweep.json``; None
    for a folder with no record (a folder of run folders, or a sweep from before litlab kept one)."""
    record = sweep_dir / RECORD_DIR
    if not record.is_dir():
        return None
    sweep = read_json(record / SWEEP_FILE) or {}  # none under Hydra's own basic sweeper
    entries = [read_json(path) for path in record.glob("*.json") if path.stem.isdigit()]
    return sorted((e for e in entries if e), key=lambda e: int(e["job_num"])), sweep


def list_job(sweep_dir: Path, job_num: int, job_dir: Path) -> None:
    """The link ``<sweep dir>/<job num>`` to a job's run folder (relative: the logs folder can be
    moved or copied whole), for ``ls`` and people; the report reads the record, not the links."""
    link = sweep_dir / str(job_num)
    if job_dir.absolute().parent == sweep_dir.absolute():
        return  # the job's folder is in the sweep's folder already
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(job_dir.absolute(), sweep_dir.absolute()), target_is_directory=True)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a record's file, a job's summary.json); None when it has none."""
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
