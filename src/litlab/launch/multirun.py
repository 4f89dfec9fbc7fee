"""Sweep jobs: each is a fresh single-run process, and a failing job becomes a failed row of the report.

``child_command`` is a job's single-run command (``python -m litlab.cli.train <overrides>
hydra.run.dir=<job dir> hydra.mode=RUN``), recorded in the job folder as ``command.sh``. The default
launcher (``litlab.launch.pool``) starts it itself; under any other launcher ``run_sweep_job`` runs it
as a child of Hydra's task process, which passes on the cluster's rank variables. A failed job writes
summary.json ``status: failed`` (``record_failure``) and the sweep goes on (docs/sweeps.md).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from litlab.config.preflight import check_train_config
from litlab.config.redact import typed_overrides
from litlab.config.rules import ConfigError
from litlab.logs import global_rank
from litlab.run.summary import FAILED, SWEEP_JOB_ENV, Summary, sweep_job

log = logging.getLogger(__name__)

# Hydra overrides that belong to the sweep, not to the job: the child is a plain single run.
# A trial's study and number reach a batch launcher's job as hydra.job.env_set; the child inherits the
# job's environment, and its command.sh must not carry the study's storage URL.
_SWEEP_ONLY = (
    "hydra.mode",
    "hydra.run",
    "hydra.sweep",
    "hydra.sweeper",
    "hydra.launcher",
    "hydra.job.num",
    "hydra.job.env_set.LITLAB_OPTUNA_TRIAL",
)
_SWEEP_ONLY_GROUPS = ("hydra/sweeper", "hydra/launcher")


class ChildFailed(RuntimeError):
    """The single-run child of a sweep job exited non-zero (its summary.json, if any, says why)."""


def run_sweep_job(cfg: DictConfig, fit: Callable[[DictConfig], float | None]) -> float | None:
    """Run one multirun job with ``fit``: in its own process, it fits; in a launcher's process (a
    submitit or joblib worker), it runs the job's single-run command as a child. A failure is
    recorded in summary.json; in a launcher's process it returns None (the sweep goes on)."""
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    is_child = HydraConfig.get().mode != RunMode.MULTIRUN
    if not is_child and global_rank() == 0:
        list_job(HydraConfig.get(), job_dir)
    try:
        # A bad value fails here, in milliseconds, before torch loads or a child starts.
        check_train_config(cfg, list(HydraConfig.get().overrides.task))
        if is_child:
            return fit(cfg)
        return run_in_child_process(cfg, job_dir)
    except Exception as error:
        record_failure(cfg, job_dir, f"{type(error).__name__}: {error}")
        if is_child:
            raise  # the child's exit status tells the sweep job; its summary.json says why
        traceback = not isinstance(error, (ConfigError, ChildFailed))  # those say all in one line
        log.error("job %s failed; the sweep goes on: %s", sweep_job()["job_num"], error, exc_info=traceback)
    return None


def child_command(hydra: DictConfig, job_dir: Path, module: str = "litlab.cli.train") -> list[str]:
    """The single-run command of a sweep job (``hydra``: the job's hydra config) of the entry point
    ``module``: its overrides, its directory, RUN mode."""
    kept_hydra = [
        o
        for o in typed_overrides(hydra.overrides.hydra)
        if not o.lstrip("+~").startswith(_SWEEP_ONLY) and not o.startswith(_SWEEP_ONLY_GROUPS)
    ]
    return [
        sys.executable,
        "-m",
        module,
        *typed_overrides(hydra.overrides.task),  # as typed: ${oc.env:...} is resolved by the child
        *kept_hydra,
        f'hydra.run.dir="{job_dir}"',
        "hydra.mode=RUN",  # a sweep file sets MULTIRUN; this one process is a single run
        "hydra.output_subdir=null",  # the job's .hydra/ (written by the sweep) stays as it is
    ]


def list_job(hydra: DictConfig, job_dir: Path) -> None:
    """List a job whose folder is its run's (``runs/<run folder>``) in the sweep's folder: a link
    ``<sweep dir>/<job number>`` to it, which ``ls``, reports and ``litlab-compare`` read as the job."""
    sweep_dir = Path(str(hydra.sweep.dir)).absolute()
    if job_dir.absolute().parent == sweep_dir:
        return
    link = sweep_dir / str(hydra.job.num)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():  # relative: the logs folder can be moved or copied whole
        link.symlink_to(os.path.relpath(job_dir.absolute(), sweep_dir), target_is_directory=True)


def run_in_child_process(cfg: DictConfig, job_dir: Path) -> float | None:
    """Run the current job as one single-run child process and return its ``optimized_metric``.

    The child gets this process's environment: a cluster's rank variables make it that rank."""
    command = child_command(HydraConfig.get(), job_dir)
    if global_rank() == 0:
        (job_dir / "command.sh").write_text(
            f"#!/bin/sh\ncd {shlex.quote(HydraConfig.get().runtime.cwd)}\n{shlex.join(command)}\n"
        )
    job = {**sweep_job(), "command": shlex.join(command)}
    env = {**os.environ, SWEEP_JOB_ENV: json.dumps(job)}
    log.info("job %s: %s", job["job_num"], shlex.join(command[1:]))
    returncode = subprocess.run(command, env=env, cwd=HydraConfig.get().runtime.cwd, check=False).returncode
    if returncode != 0:
        raise ChildFailed(f"the job's process {describe_exit(returncode)}")
    summary = json.loads((job_dir / "summary.json").read_text())
    return summary["metrics"].get(cfg.optimized_metric)


def describe_exit(returncode: int) -> str:
    """How a process ended, in words: "exited with status 1", "was killed by SIGKILL (out of memory?)"."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {returncode}"


def record_failure(cfg: DictConfig, job_dir: Path, error: str) -> None:
    """Make sure the job's summary.json says it failed and why (rank 0 writes it).

    A run that failed while training already wrote a full summary (``Run.recording_failure``); one
    that failed before its Trainer existed (a bad value, a global batch that does not divide) gets
    the fields its config knows.
    """
    if global_rank() != 0:
        return
    path = job_dir / "summary.json"
    existing = Summary.load(path) if path.is_file() else None
    if existing is not None and existing.status == FAILED:
        return  # written where the run failed, with the most precise error
    if existing is not None:  # a child that wrote a completed summary, then exited non-zero
        existing.status, existing.error = FAILED, error
        existing.write(path)
        return
    hydra = HydraConfig.get()
    Summary.of_config(
        cfg,
        FAILED,
        error,
        run_dir=job_dir,
        choices=dict(hydra.runtime.choices),
        overrides=typed_overrides(hydra.overrides.task),
        sweep=sweep_job(),
    ).write(path)
