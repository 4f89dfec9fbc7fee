"""Sweep jobs: each a fresh single-run process (``child_command``, recorded as its ``command.sh``); a
failing job is a failed row of the report, and the sweep goes on. The sweepers' shared planning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode, TaskFunction
from omegaconf import DictConfig, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from litlab.config.identity import settings_fingerprint
from litlab.config.preflight import check_train_config, composition_message
from litlab.config.redact import typed_overrides
from litlab.config.rules import ConfigError
from litlab.errors import EXIT_REFUSED, LitlabError, describe_exit, error_line, one_line
from litlab.logs import global_rank
from litlab.run import sweep_record
from litlab.run.combinations import check_combination
from litlab.run.summary import COMPLETED, FAILED, NOT_STARTED, RUNNING, SWEEP_JOB_ENV, Summary, now, sweep_job

log = logging.getLogger(__name__)

# Hydra overrides that belong to the sweep, not to the job: the child is a plain single run. (A trial's
# study reaches a batch launcher's job as hydra.job.env_set: command.sh must not carry its storage URL.)
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


class _ChildFailed(RuntimeError):
    """The single-run child of a sweep job exited non-zero (its summary.json, if any, says why)."""


def run_sweep_job(cfg: DictConfig, fit: Callable[[DictConfig], float | None]) -> float | None:
    """Run one multirun job with ``fit``: in its own process, it fits; in a launcher's process (a
    submitit or joblib worker), it runs the job's single-run command as a child, and a failure
    returns None (the sweep goes on). A failure is recorded in summary.json."""
    hydra = HydraConfig.get()
    job_dir = Path(hydra.runtime.output_dir)
    is_child = hydra.mode != RunMode.MULTIRUN
    recording = not is_child and global_rank() == 0
    started_at = now()
    if recording:
        sweep_record.list_job(Path(str(hydra.sweep.dir)), int(hydra.job.num), job_dir)
        running = job_summary(cfg, job_dir, None, RUNNING, started_at=started_at).to_dict()
        record_job(hydra, job_dir, running, RUNNING)
    value = None
    try:
        if is_child:
            return fit(cfg)
        # In a launcher's process: the job's single-run command as a child, with this process's
        # environment (a cluster's rank variables make it that rank).
        command = child_command(hydra, job_dir)
        if global_rank() == 0:
            write_command(job_dir, hydra.runtime.cwd, command)
        job = {**sweep_job(), "command": shlex.join(command)}
        log.info("job %s: %s", job["job_num"], shlex.join(command[1:]))
        env = {**os.environ, SWEEP_JOB_ENV: json.dumps(job)}
        returncode = subprocess.run(command, env=env, cwd=hydra.runtime.cwd, check=False).returncode
        if returncode != 0:
            raise _ChildFailed(f"the job's process {describe_exit(returncode)}")
        value = json.loads((job_dir / "summary.json").read_text())["metrics"].get(cfg.optimized_metric)
    except Exception as error:
        record_failure(cfg, job_dir, f"{type(error).__name__}: {error}")
        if is_child:
            raise  # the child's exit status tells the sweep job; its summary.json says why
        traceback = not isinstance(error, (ConfigError, _ChildFailed))  # those say all in one line
        log.error("job %s failed; the sweep goes on: %s", sweep_job()["job_num"], error, exc_info=traceback)
    if recording:
        summary = sweep_record.read_json(job_dir / "summary.json") or {}
        record_job(hydra, job_dir, summary, *sweep_record.outcome_of(summary, started_at))
    return value


def record_job(hydra: DictConfig, job_dir: Path, summary: dict, outcome: str, note=None, pool=None) -> None:
    """The sweep's record of a job (``hydra``: the job's hydra config); ``pool``: the device pool's
    record of the attempt."""
    overrides = typed_overrides(hydra.overrides.task)
    where = (Path(str(hydra.sweep.dir)), int(hydra.job.num), outcome, summary)
    sweep_record.write_job(*where, run_dir=job_dir, overrides=overrides, note=note, pool=pool)
    changed = ", ".join(summary.get("resumed_across") or [])
    if changed:  # said in the sweep's log too, not only in the run's train.log
        log.warning(
            f"job {hydra.job.num} resumed run {summary.get('run_name')} across a change ({changed}): it "
            "trained partly under each, so its report row is marked and left out of significance tests"
        )


def child_command(hydra: DictConfig, job_dir: Path, module: str = "litlab.cli.train") -> list[str]:
    """The single-run command of a sweep job (``hydra``: its hydra config) of the entry point ``module``."""
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


def write_command(job_dir: Path, cwd: str, command: list[str]) -> None:
    """The job's command.sh: the job alone, as the sweep ran it."""
    (job_dir / "command.sh").write_text(
        "#!/bin/sh\n# This sweep job alone, as the sweep ran it (from the sweep's directory):\n"
        f"cd {shlex.quote(str(cwd))}\n{shlex.join(command)}\n"
    )


def job_summary(cfg: DictConfig, job_dir: Path, error: str | None, status: str, **known: Any) -> Summary:
    """The Summary of the current job (HydraConfig: its config) where its process wrote none."""
    hydra = HydraConfig.get()
    return Summary.of(cfg, error, run_dir=job_dir, hydra=hydra, status=status, sweep=sweep_job(), **known)


def record_failure(cfg: DictConfig, job_dir: Path, error: str, status: str = FAILED) -> None:
    """Make sure the summary.json of a job whose process ended badly says so and why (``status``:
    interrupted where its sweep stopped it); one its run wrote as it stopped stays. Rank 0 writes it."""
    if global_rank() != 0:
        return
    path = job_dir / "summary.json"
    existing = Summary.load(path) if path.is_file() else None
    if existing is None:
        job_summary(cfg, job_dir, error, status).write(path)
    elif existing.status == COMPLETED:  # a child that wrote a completed summary, then exited non-zero
        dataclasses.replace(existing, status=status, error=error).write(path)


class PlanningSweeper(Sweeper):
    """What litlab's sweepers (the grid, the Optuna search) share: Hydra's setup, which gives them their
    launcher, and a sweep ended in one ``litlab: error:`` line when ``run`` raises ConfigError (exit 2)
    or a LitlabError (its ``exit_code``)."""

    config: DictConfig | None = None
    hydra_context: HydraContext | None = None
    launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        try:
            return self.run(arguments)
        except (ConfigError, LitlabError) as error:
            reason = getattr(error, "reason", error)
            callbacks = self.hydra_context.callbacks if self.hydra_context else None
            if callbacks and sweep_record.started(Path(str(self.config.hydra.sweep.dir))):
                # A sweep that ran jobs ends with its report, which says it stopped; the error is last.
                with contextlib.suppress(SystemExit):
                    callbacks.on_multirun_end(config=self.config, stopped=one_line(reason))
                sys.stdout.flush()
            sys.stderr.write(error_line(reason) + "\n")
            raise SystemExit(getattr(error, "exit_code", EXIT_REFUSED)) from None

    def run(self, arguments: list[str]) -> Any:
        raise NotImplementedError


def job_config(
    hydra_context: HydraContext, sweep_config: DictConfig, overrides: list[str], num: int
) -> DictConfig:
    """Job ``num``'s config as Hydra composes it, set as the current HydraConfig; raises ConfigError (one
    line) when it does not compose."""
    try:
        config = hydra_context.config_loader.load_sweep_config(sweep_config, list(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        raise ConfigError(composition_message(error)) from None
    with open_dict(config):
        config.hydra.job.id = num
        config.hydra.job.num = num
    HydraConfig.instance().set_config(config)  # ${hydra:...} resolves for this job
    output_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = str(output_dir.absolute())
    HydraConfig.instance().set_config(config)
    return config


class NotComposed(ConfigError):
    """A sweep's job whose overrides do not compose (``plan_job``)."""


@dataclass(frozen=True)
class JobPlan:
    """Where a sweep's job would write and what it would train (None for entry points that store no run)."""

    num: int
    overrides: list[str]
    folder: Path
    identity: str | None
    settings: str | None
    summary: dict[str, Any] | None = None  # what the sweep's record says of it until it starts

    def record(self, sweep_dir: Path, num: int) -> None:
        """The sweep's record of this training job, planned as job ``num``."""
        if self.summary is not None:
            summary = {**self.summary, "sweep": {"dir": str(sweep_dir), "job_num": num}}
            sweep_record.plan(sweep_dir, num, summary, run_dir=self.folder, overrides=self.overrides)


# Launchers whose jobs run on this machine, so that its devices are theirs (a Slurm launcher's jobs
# run on the cluster's nodes: a login node without GPUs submits GPU jobs).
_LAUNCHERS_HERE = (
    "litlab_pool.DevicePoolLauncher",
    "submitit_launcher.LocalLauncher",
    "joblib_launcher.JoblibLauncher",
    "basic_launcher.BasicLauncher",
)


def plan_job(
    hydra_context: HydraContext,
    sweep_config: DictConfig,
    overrides: list[str],
    num: int,
    refusal: str = "the job {} does not compose",
) -> JobPlan:
    """Job ``num`` composed and planned: where a sweeper checks a job's config, once, before it starts
    (its process checks nothing again). Raises NotComposed, ``refusal`` (its ``{}``: the overrides), when
    it does not compose; ConfigError or LitlabError, a single run's line, when a training job's config
    fails its checks or asks for devices this machine lacks."""
    sweep_hydra_config = HydraConfig.instance().cfg
    try:
        try:
            config = job_config(hydra_context, sweep_config, overrides, num)
        except ConfigError as error:
            raise NotComposed(f"{refusal.format(' '.join(overrides))}: {error}") from None
        folder = Path(str(config.hydra.runtime.output_dir))
        if config.get("task_name") != "train":
            return JobPlan(num, list(overrides), folder, None, None)
        check_train_config(config, list(config.hydra.overrides.task))
        if str(config.hydra.launcher.get("_target_", "")).endswith(_LAUNCHERS_HERE):
            check_combination(config.trainer, config.strategy)  # trainer=gpu on a CPU machine: before any job
        summary = Summary.of(config, None, run_dir=folder, hydra=config.hydra, status=NOT_STARTED)
        fingerprint = settings_fingerprint(summary.settings)
        return JobPlan(num, list(overrides), folder, summary.run_name, fingerprint, summary.to_dict())
    finally:
        HydraConfig.instance().cfg = sweep_hydra_config


def distinct_runs(plans: list[JobPlan]) -> tuple[list[JobPlan], list[tuple[JobPlan, JobPlan]]]:
    """The jobs that train distinct runs, and each other job with the earlier one that trains the same run
    (``optimizer.lr=0.002,2e-3``). Raises ConfigError when two jobs that train differently would share a
    run name or a folder: their results would overwrite each other's."""
    unique: list[JobPlan] = []
    same: list[tuple[JobPlan, JobPlan]] = []
    by_identity: dict[str, JobPlan] = {}
    by_folder: dict[Path, JobPlan] = {}
    for plan in plans:
        if plan.identity is None:
            unique.append(plan)
            continue
        first = by_identity.get(plan.identity)
        if first is not None and first.settings == plan.settings:
            same.append((plan, first))
            continue
        if first is not None:
            raise _collision(first, plan, f"the run name {plan.identity}")
        other = by_folder.get(plan.folder)
        if other is not None:
            raise _collision(other, plan, f"the folder {plan.folder}")
        by_identity[plan.identity] = by_folder[plan.folder] = plan
        unique.append(plan)
    return unique, same


def _collision(first: JobPlan, second: JobPlan, shared: str) -> ConfigError:
    def own(plan: JobPlan, other: JobPlan) -> str:
        return " ".join(o for o in plan.overrides if o not in other.overrides) or "no overrides"

    return ConfigError(
        f"jobs #{first.num} ({own(first, second)}) and #{second.num} ({own(second, first)}) train "
        f"different runs but would share {shared}: in a sweep, leave run_name, hydra.run.dir and "
        "hydra.sweep.subdir unset (each run gets its own folder) or make them differ with every swept value"
    )
