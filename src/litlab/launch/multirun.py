"""Sweep jobs: each runs exactly as it would alone, and a failing job becomes a failed row of the report.

One job, one result. A job's result must be the result of the same overrides run alone, whatever
ran before it in the same process. Jobs that would change process-wide state that cannot be put
back (a process group, several ranks, torch.compile's caches) run in a fresh single-run child
process; the others run in the sweep's process and ``litlab.isolation`` restores what they changed
(``own_process_reason`` says which is which, and why). Whether a cluster started this process's
ranks is read from the environment the process started with (``launch.PROCESS_START_ENV``).

Multirun x DDP. Lightning's subprocess launcher starts ranks 1..N-1 by re-running ``sys.argv``. In a
multirun that still holds ``-m`` and the sweep, so every rank would start a sweep of its own (and,
with Optuna, sample its own parameters). litlab therefore runs such a job as ONE single-run child
process, ``python -m litlab.train <the job's overrides> hydra.run.dir=<job dir> hydra.mode=RUN``,
which launches its ranks exactly as a plain single run does, and reads the child's summary.json.
Why this approach: it depends on no Lightning internals (only on the documented fact that ranks
re-run the command line), it works the same under every launcher (basic, joblib) and sweeper
(basic, Optuna: the parameters are sampled once, in the sweep process, and reach every rank as
plain overrides), and a crash of the job's process cannot take the sweep down. The alternatives
(``ddp_spawn``, patching the launcher's command) need picklable everything or track Lightning's
private code. Jobs whose ranks the cluster starts (Slurm tasks, torchrun) run in-process.

Failure isolation. Hydra's basic sweeper raises the first failed job's exception after the batch,
and Optuna's gives up above ``max_failure_rate``; either skips the end-of-sweep report. A sweep job
therefore records its failure (summary.json with ``status: failed`` and the error), frees what it
held, and returns None; the report callback (``litlab.compare.SweepReport``) then makes the
multirun exit non-zero.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from litlab.config.preflight import check_train_config
from litlab.config.rules import ConfigError, device_count
from litlab.launch.ranks import PROCESS_START_ENV, cluster_started_ranks
from litlab.logs import global_rank

log = logging.getLogger(__name__)

# Set for the single-run child of a sweep job (and inherited by its ranks): the job's sweep
# directory and number, as JSON, for summary.json and for recording the job's failure.
SWEEP_JOB_ENV = "LITLAB_SWEEP_JOB"

# Hydra overrides that belong to the sweep, not to the job: the child is a plain single run.
_SWEEP_ONLY = ("hydra.mode", "hydra.run", "hydra.sweep", "hydra.sweeper", "hydra.launcher", "hydra.job.num")
_SWEEP_ONLY_GROUPS = ("hydra/sweeper", "hydra/launcher")


class ChildFailed(RuntimeError):
    """The single-run child of a sweep job exited non-zero (its summary.json, if any, says why)."""


def sweep_job() -> dict[str, Any] | None:
    """The sweep directory and job number of this process's run, or None outside a multirun."""
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:  # the job runs in the sweep's process
        return {"dir": hydra.sweep.dir, "job_num": hydra.job.num, "process": "sweep"}
    inherited = os.environ.get(SWEEP_JOB_ENV)
    return json.loads(inherited) if inherited else None


def run_sweep_job(cfg: DictConfig, fit: Callable[[DictConfig], float | None]) -> float | None:
    """Run one multirun job with ``fit``, exactly as the same overrides would run alone: in a fresh
    single-run child process when the job would change what cannot be put back (``own_process_reason``),
    otherwise in this process, with the process-wide state it changes restored afterwards. A failure
    is recorded in summary.json and returns None."""
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    is_child = HydraConfig.get().mode != RunMode.MULTIRUN
    try:
        # A bad value fails here, in milliseconds, before torch loads or a child starts.
        check_train_config(cfg, list(HydraConfig.get().overrides.task))
        if is_child:
            return fit(cfg)
        reason = own_process_reason(cfg)
        if reason is not None:
            return run_in_child_process(cfg, job_dir, reason)
        from litlab.launch.isolation import process_state_restored

        with process_state_restored():
            return fit(cfg)
    except Exception as error:
        record_failure(cfg, job_dir, f"{type(error).__name__}: {error}")
        if is_child:
            raise  # the child's exit status tells the sweep job; its summary.json says why
        traceback = not isinstance(error, (ConfigError, ChildFailed))  # those say all in one line
        log.error("job %s failed; the sweep goes on: %s", sweep_job()["job_num"], error, exc_info=traceback)
    # Outside the except block: the traceback no longer holds the failed run's model and tensors.
    _release_memory()
    return None


def own_process_reason(cfg: DictConfig) -> str | None:
    """Why this sweep job must run in a fresh process of its own; None when it can run in the
    sweep's process (its changes to process-wide state are then restored, ``litlab.isolation``).

    A fresh process costs one start (~8 s of imports on a 2-core CPU). It is chosen where putting
    the process back is impossible or not certain:

    - more than one rank, or ``trainer.devices=auto`` off the CPU: Lightning's launcher re-runs the
      command line, which in a multirun holds the whole sweep; spawned ranks must pickle everything;
    - any strategy but ``auto`` (ddp, ddp_spawn, fsdp, also on one device): a process group,
      Lightning's rendezvous variables and the CPU thread count are set for the whole process;
    - ``compile``: torch.compile's caches and recompile limits are per process (a later job
      compiling the same ``forward`` would count against them and could silently run eagerly);
    - ``sweep_isolation=process``: every job, for those who want no shared process at all.

    When a cluster (torchrun, Slurm, LSF, submitit) started this process as a rank, the job runs
    here on every rank: the cluster, not litlab, owns the processes.
    """
    if cluster_started_ranks():
        return None
    if cfg.sweep_isolation == "process":
        return "sweep_isolation=process"
    trainer = cfg.trainer
    processes = device_count(trainer.devices)
    if processes is None and trainer.accelerator != "cpu":  # "auto": one process per GPU, unknown here
        return f"trainer.devices={trainer.devices} may mean several ranks"
    ranks = (processes or 1) * trainer.num_nodes
    if ranks > 1:
        return f"{ranks} ranks"
    if cfg.strategy.name != "auto":
        return f"strategy={cfg.strategy.name} sets up a process group for the whole process"
    if cfg.compile:
        return "compile=true keeps torch.compile's caches for the whole process"
    return None


def child_command(job_dir: Path) -> list[str]:
    """The single-run command of the current sweep job: its overrides, its directory, RUN mode."""
    hydra = HydraConfig.get()
    kept_hydra = [
        o
        for o in hydra.overrides.hydra
        if not o.lstrip("+~").startswith(_SWEEP_ONLY) and not o.startswith(_SWEEP_ONLY_GROUPS)
    ]
    return [
        sys.executable,
        "-m",
        "litlab.cli.train",
        *hydra.overrides.task,
        *kept_hydra,
        f'hydra.run.dir="{job_dir}"',
        "hydra.mode=RUN",  # a sweep file sets MULTIRUN; this one process is a single run
        "hydra.output_subdir=null",  # the job's .hydra/ (written by the sweep) stays as it is
    ]


def run_in_child_process(cfg: DictConfig, job_dir: Path, reason: str) -> float | None:
    """Run the job as one single-run child process and return its ``optimized_metric``.

    The child gets the environment this process started with, not what earlier jobs left in it.
    """
    command = child_command(job_dir)
    job = {**sweep_job(), "process": "own", "own_process_reason": reason}
    env = {**PROCESS_START_ENV, SWEEP_JOB_ENV: json.dumps(job)}
    log.info("job %s runs in a process of its own (%s): %s", job["job_num"], reason, " ".join(command[1:]))
    returncode = subprocess.run(command, env=env, cwd=HydraConfig.get().runtime.cwd, check=False).returncode
    if returncode != 0:
        raise ChildFailed(f"the job's process {_describe_exit(returncode)}")
    summary = json.loads((job_dir / "summary.json").read_text())
    return summary["metrics"].get(cfg.optimized_metric)


def _describe_exit(returncode: int) -> str:
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
    from litlab.run.summary import FAILED, Summary

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
        overrides=list(hydra.overrides.task),
        sweep=sweep_job(),
    ).write(path)


def _release_memory() -> None:
    """Give back what a failed in-process job held, so an out-of-memory job does not starve the next."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
