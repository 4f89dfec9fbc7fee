"""The default launcher (``hydra/launcher=local``): sweep jobs, each a process of its own, queued over a
pool of devices and CPU cores, the largest first, smaller ones backfilling. Its record of each job goes
to the sweep's record, never into a run's summary.json. The rules: docs/sweeps.md.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime as dt
import glob
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    _save_config,
    configure_log,
    filter_overrides,
    setup_globals,
)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from litlab.config.redact import typed_overrides  # omegaconf only: the plugin module stays light
from litlab.config.rules import usable_cores
from litlab.errors import ERROR_PREFIX, EXIT_PREEMPTED, EXIT_REFUSED, describe_exit, error_line

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_POLL_S = 0.05  # how often the sweep looks for ended jobs
_LOOK_S = 1.0  # how often it looks for other processes' runs training beside its jobs


@dataclass
class QueuedJob:
    """One job for ``run_queue``: its overrides (as a sweeper passes them) and its process's extra env."""

    overrides: list[str]
    env: dict[str, str] = field(default_factory=dict)
    refusal: str | None = None  # why it must not start (a rule its config fails): a failed row


# --- the pool and its schedule: pure, no processes ------------------------------------------------


def _visible_gpus() -> list[str] | None:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them; None on a machine without."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [d.strip() for d in listed.split(",") if d.strip()]
        return ids or None
    if not glob.glob("/dev/nvidia[0-9]*"):  # no NVIDIA device: no need to import torch to know
        return None
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] or None


def pool_ids(devices: Any, gpus: list[str] | None) -> list[str]:
    """The pool's device ids for ``hydra.launcher.devices`` on a machine that sees ``gpus``; ValueError
    (one line) for a value that is not a pool."""
    if devices is None:
        return list(gpus) if gpus else ["0"]
    if isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1:
        if gpus and devices > len(gpus):
            shown = f"{len(gpus)} GPUs ({','.join(gpus)})"
            raise ValueError(f"hydra.launcher.devices={devices}: the sweep sees {shown}")
        return list(gpus[:devices]) if gpus else [str(i) for i in range(devices)]
    if isinstance(devices, (list, tuple, ListConfig)):
        ids = [str(d).strip() for d in devices]
        if ids and all(ids) and len(set(ids)) == len(ids):
            return ids
        devices = list(devices)
    allowed = "use null (every GPU), a count >= 1 or a list of distinct ids"
    raise ValueError(f"hydra.launcher.devices={devices!r} is not allowed: {allowed}")


def cpu_share(slot: int, slots: int, cores: Sequence[int]) -> list[int]:
    """The cores of slot ``slot`` of ``slots``: an even, contiguous part of ``cores`` (one shared core
    when there are fewer cores than slots)."""
    cores = sorted(cores)
    share = cores[slot * len(cores) // slots : (slot + 1) * len(cores) // slots]
    return share or [cores[slot * len(cores) // slots]]


@dataclass
class Pending:
    """A job waiting for devices: its index and how many device ids it needs."""

    index: int
    need: int


class DeviceSchedule:
    """Which device ids are free, and which queued job starts next (largest first, then backfill).
    Each id has ``jobs_per_device`` slots; a job takes one slot on each of ``need`` distinct ids, the
    least loaded first. Without GPUs (``gpus=False``) the ids are process slots: a job that needs more
    than the pool has waits until the pool is idle, then runs alone on every slot."""

    def __init__(
        self, ids: Sequence[str], jobs_per_device: int = 1, cores: Sequence[int] = (0,), gpus: bool = True
    ) -> None:
        if not isinstance(jobs_per_device, int) or isinstance(jobs_per_device, bool) or jobs_per_device < 1:
            raise ValueError(
                f"hydra.launcher.jobs_per_device={jobs_per_device} is not allowed: use an int >= 1"
            )
        self.ids = list(ids)
        self.jobs_per_device = jobs_per_device
        self.cores = sorted(cores)
        self.gpus = gpus
        # busy[id] = the slot numbers (0..jobs_per_device-1) of that id that hold a job
        self.busy: dict[str, set[int]] = {i: set() for i in self.ids}

    @property
    def size(self) -> int:
        return len(self.ids)

    def fits_ever(self, need: int) -> bool:
        return need >= 1 and (need <= self.size or not self.gpus)

    def free_ids(self) -> list[str]:
        """Ids with a free slot, the least loaded first (then pool order)."""
        free = [i for i in self.ids if len(self.busy[i]) < self.jobs_per_device]
        return sorted(free, key=lambda i: len(self.busy[i]))

    def fits_now(self, need: int) -> bool:
        if need > self.size:  # the whole pool, alone
            return not any(self.busy.values())
        return need <= len(self.free_ids())

    def next_to_start(self, queue: Sequence[Pending]) -> Pending | None:
        """The queued job to start now: the largest that fits the free ids (ties: the earliest)."""
        by_size = sorted(queue, key=lambda j: (-j.need, j.index))
        return next((job for job in by_size if self.fits_now(job.need)), None)

    def take(self, need: int) -> Taken:
        """A slot on each of ``need`` free ids (every slot, for a job larger than the pool), and its cores."""
        if not self.fits_now(need):
            raise RuntimeError(f"{need} devices asked for, {len(self.free_ids())} free")
        whole = need > self.size
        slots, cores = [], set()
        for device in self.ids if whole else self.free_ids()[:need]:
            free = sorted(set(range(self.jobs_per_device)) - self.busy[device])
            for slot in free if whole else free[:1]:
                self.busy[device].add(slot)
                slots.append((device, slot))
                number = self.ids.index(device) * self.jobs_per_device + slot
                cores.update(cpu_share(number, self.size * self.jobs_per_device, self.cores))
        ids = sorted({device for device, _ in slots}, key=self.ids.index)
        return Taken(ids, sorted(cores), slots)

    def give_back(self, taken: Taken) -> None:
        for device, slot in taken.slots:
            self.busy[device].discard(slot)


@dataclass
class Taken:
    """What a started job holds: device ids (in pool order), CPU cores, and the slots behind them."""

    ids: list[str]
    cores: list[int]
    slots: list[tuple[str, int]]


# --- the launcher ------------------------------------------------------------------------------------


@dataclass
class _Job:
    index: int
    config: DictConfig  # the job's full config (with hydra)
    dir: Path
    command: list[str]
    need: int
    env: dict[str, str]
    identity: str | None = None  # the run identity (train jobs): its storage folder and lock
    task_cfg: Any = None  # the config without its hydra node: copied once, when the job is prepared
    storage: Any = None  # its RunStorage where it is on this machine's disk: the sweep takes its lock
    claim: Any = None  # the lock's Holder while the sweep holds it for the job's process
    taken: Taken | None = None
    process: subprocess.Popen | None = None
    start: str | None = None
    start_s: float = 0.0
    started_at: str = ""  # local time, as summary.json's started_at: did this job train its run?
    end: str | None = None
    beside: set[int | str] = field(default_factory=set)  # other jobs of the sweep; other runs (names)


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _die_with_parent_and_pin(cores: list[int], parent: int) -> Callable[[], None]:
    """Run between fork and exec: SIGTERM when the sweep dies (even by SIGKILL), and the job's cores."""

    def setup() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the job outlives a killed sweep
            pass
        if os.getppid() != parent:  # the sweep died before prctl took effect
            os._exit(EXIT_PREEMPTED)
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    return setup


class DevicePoolLauncher(Launcher):
    """Hydra launcher: the sweep's jobs as child processes on a pool of devices (module docstring)."""

    def __init__(self, devices: Any = None, jobs_per_device: int = 1) -> None:
        self.devices = devices
        self.jobs_per_device = jobs_per_device
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self._stopped: str | None = None  # why the sweep stops its jobs (stop)
        self._signalled = False  # by SIGTERM or SIGINT: the sweep exits as preempted
        self._running: dict[int, _Job] = {}
        self._timed_by = f"{socket.gethostname()} {_utc_now()}"  # this start of the sweep: its timings

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Hydra's API: a fixed list of jobs, all queued at once (so the largest can go first)."""
        returns: dict[int, JobReturn] = {}
        jobs = {initial_job_idx + i: QueuedJob(list(o)) for i, o in enumerate(job_overrides)}
        self.run_queue(jobs.get, returns.__setitem__, initial_job_idx, announced=len(jobs))
        return [returns[index] for index in jobs]

    def run_queue(
        self,
        next_job: Callable[[int], QueuedJob | None],
        on_done: Callable[[int, JobReturn], None],
        first_index: int = 0,
        announced: int | None = None,
    ) -> None:
        """Ask ``next_job(job_idx)`` for a job whenever a device is free and no queued job fits it
        (None: no more jobs; ``announced``: a fixed list of that many, all queued at once); call
        ``on_done(job_idx, job_return)`` as each job ends. Returns when there are no more jobs and every
        started one has ended, or once ``stop`` has stopped them."""
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        schedule = self._schedule()
        ids = schedule.ids
        count = f"{announced} jobs" if announced is not None else "jobs as they come"
        slots = f"{schedule.jobs_per_device} job{'s' * (schedule.jobs_per_device > 1)} per device"
        devices = f"{len(ids)} device{'s' * (len(ids) > 1)} ({','.join(ids)})"
        log.info(f"Launching {count} on a pool of {devices}, {slots}")
        sweep_hydra_config = HydraConfig.instance().cfg  # each job's is set while it is prepared
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self._stopped, self._signalled = None, False
        queue: dict[int, _Job] = {}
        try:
            self._loop(next_job, on_done, first_index, announced is not None, queue, schedule)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for job in self._running.values():  # an error in the sweep itself: its jobs stop too
                self._terminate(job)
            HydraConfig.instance().cfg = sweep_hydra_config
        if self._stopped is not None:
            from litlab.run.summary import INTERRUPTED

            for job in queue.values():  # never started: the record says why
                HydraConfig.instance().set_config(job.config)
                error = f"the sweep was stopped by {self._stopped} before the job started"
                not_started(job.task_cfg, job.dir, error, INTERRUPTED, self._pool_record(job))
            log.warning(
                "sweep stopped by %s; the same command resumes it (completed jobs are skipped)", self._stopped
            )
            if self._signalled:
                raise SystemExit(EXIT_PREEMPTED)  # what the jobs got: preempted, resumable

    def _schedule(self) -> DeviceSchedule:
        """The pool's devices and their slots; a bad setting ends the sweep in one line (exit 2)."""
        try:
            gpus = _visible_gpus()
            ids = pool_ids(self.devices, gpus)
            # Without GPUs the ids are slot names (and no CUDA_VISIBLE_DEVICES).
            return DeviceSchedule(ids, self.jobs_per_device, usable_cores(), gpus=gpus is not None)
        except ValueError as error:
            sys.stderr.write(error_line(error) + "\n")
            raise SystemExit(EXIT_REFUSED) from None

    def _loop(
        self, next_job: Callable, on_done: Callable, index: int, queue_all: bool, queue: dict, schedule: Any
    ) -> None:
        """Take jobs, start what fits, collect what ended; until none is left or the sweep is stopped."""
        more, look_at = True, 0.0
        while True:
            while more and self._stopped is None and (queue_all or self._wants_job(queue, schedule)):
                queued = next_job(index)
                if queued is None:
                    more = False
                    break
                job = self._prepare(index, queued, schedule)
                if isinstance(job, _Job):
                    queue[index] = job
                else:  # not started: too large, or completed before
                    on_done(index, job)
                index += 1
            while self._stopped is None:  # start what fits
                chosen = schedule.next_to_start(self._startable(queue))
                if chosen is None:
                    break
                job = queue.pop(chosen.index)
                HydraConfig.instance().set_config(job.config)  # ${hydra:...} resolves for this job
                held = self._claim(job)
                if held is not None:  # another process trains its run: nothing of it is written
                    on_done(job.index, held)
                else:
                    self._start(job, schedule)
            if not self._running and (self._stopped is not None or (not queue and not more)):
                return
            time.sleep(_POLL_S)
            if time.monotonic() >= look_at:
                self._look_beside()
                look_at = time.monotonic() + _LOOK_S
            for job in [job for job in self._running.values() if job.process.poll() is not None]:
                del self._running[job.index]
                schedule.give_back(job.taken)
                on_done(job.index, self._finish(job))

    def _wants_job(self, queue: dict[int, _Job], schedule: DeviceSchedule) -> bool:
        """A device is free, no queued job fits it, and the queue is shorter than the pool's slots."""
        fits = schedule.next_to_start(self._startable(queue)) is not None
        return (
            bool(schedule.free_ids()) and not fits and len(queue) < schedule.size * schedule.jobs_per_device
        )

    def _startable(self, queue: dict[int, _Job]) -> list[Pending]:
        """Queued jobs whose run no running job holds (``seed=1,1``: the second waits, then finds it done)."""
        held = {job.identity for job in self._running.values()}
        return [
            Pending(j.index, j.need) for j in queue.values() if j.identity is None or j.identity not in held
        ]

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signalled = True
        self.stop(signal.Signals(signum).name)

    def stop(self, reason: str) -> None:
        """Stop the running jobs at a checkpoint (SIGTERM) and start no more; ``run_queue`` then returns,
        and the queued jobs are recorded as stopped by ``reason`` (``SIGTERM``, a database outage)."""
        if self._stopped is None:
            running = f"the {len(self._running)} running job(s)"
            log.warning(f"{reason}: stopping {running} (SIGTERM: each writes preempted.ckpt)")
            self._stopped = reason
        for job in list(self._running.values()):  # also called from a sweeper's own thread
            self._terminate(job)

    @staticmethod
    def _terminate(job: _Job) -> None:
        if job.process is not None and job.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # the job's ranks are in its process group
                os.killpg(job.process.pid, signal.SIGTERM)

    def _prepare(self, index: int, queued: QueuedJob, schedule: DeviceSchedule) -> _Job | JobReturn:
        """The job, composed; its JobReturn where it never starts (refused) or its run completed."""
        from litlab.config.identity import run_identity
        from litlab.config.rules import device_count
        from litlab.launch.multirun import child_command, job_config
        from litlab.run import sweep_record

        assert self.hydra_context is not None and self.config is not None
        config = job_config(self.hydra_context, self.config, list(queued.overrides), index)
        job_dir = Path(config.hydra.runtime.output_dir)
        task_cfg = task_config(config)
        command = child_command(config.hydra, job_dir, self._entry_module())
        log.info("\t#%d : %s", index, " ".join(filter_overrides(queued.overrides)))
        need = device_count(OmegaConf.select(task_cfg, "trainer.devices", default=1))
        if need is None:  # "auto", -1: every device a job sees; on the CPU one process
            cpu = OmegaConf.select(task_cfg, "trainer.accelerator", default="auto") == "cpu"
            need = 1 if cpu else schedule.size
        identity = run_identity(task_cfg) if task_cfg.get("task_name") == "train" else None
        job = _Job(index, config, job_dir, command, need, dict(queued.env), identity, task_cfg)
        refusal = queued.refusal or self._refusal(job, schedule)
        if refusal is not None:  # never a run: its folder is the sweep's, named by the job's number
            job.dir = Path(str(config.hydra.sweep.dir)) / str(index)
            self._write_job_files(job)
            summary = not_started(task_cfg, job.dir, refusal, pool=self._pool_record(job))
            return self._job_return(job, summary.to_dict())
        root = str(OmegaConf.select(task_cfg, "storage.root", default="") or "").removeprefix("file://")
        if identity is not None and root and "://" not in root:  # the job's own process reads the others
            from litlab.storage.roots import RunStorage

            job.storage = RunStorage(root, identity)
        completed = self._completed(task_cfg, config.hydra, identity) if job.storage else None
        if completed is None:
            return job
        log.info("job %d: run %s already completed, skipped", index, completed.get("run_name"))
        sweep_record.list_job(Path(str(config.hydra.sweep.dir)), index, job_dir)
        self._record(job, completed, sweep_record.SKIPPED, sweep_record.skipped_note(completed))
        return self._job_return(job, completed)

    def _claim(self, job: _Job) -> JobReturn | None:
        """Take the run's lock for the job's process; held elsewhere: its JobReturn, running elsewhere."""
        from litlab.launch.multirun import job_summary
        from litlab.run.summary import RUNNING_ELSEWHERE
        from litlab.run.sweep_record import ELSEWHERE
        from litlab.storage import lock

        try:
            job.claim = lock.take(job.storage) if job.storage is not None else None
        except lock.RunLocked as held:
            log.warning("job %d not started: %s", job.index, held.reason)
            summary = job_summary(job.task_cfg, job.dir, held.reason, RUNNING_ELSEWHERE).to_dict()
            self._record(job, summary, ELSEWHERE)
            return self._job_return(job, summary)
        return None

    def _pool_record(self, job: _Job) -> dict[str, Any]:
        devices = job.taken.ids if job.taken else []
        pool = {"devices": devices, "start": job.start, "end": job.end, "beside": sorted(job.beside, key=str)}
        return {**pool, "timed_by": self._timed_by, "command": shlex.join(job.command)}

    def _record(self, job: _Job, summary: dict[str, Any], outcome: str, note: str | None = None) -> None:
        """The sweep's record of a training job (litlab-eval's store no run), with the pool's."""
        from litlab.launch.multirun import record_job

        if job.identity is not None:
            record_job(job.config.hydra, job.dir, summary, outcome, note, self._pool_record(job))

    def _write_job_files(self, job: _Job) -> None:
        """The job's .hydra/ (its config as composed) and command.sh (the job alone)."""
        from litlab.launch.multirun import write_command

        config = job.config
        job.dir.mkdir(parents=True, exist_ok=True)
        if config.hydra.output_subdir is not None:
            hydra_output = job.dir / str(config.hydra.output_subdir)
            _save_config(job.task_cfg, "config.yaml", hydra_output)
            _save_config(OmegaConf.masked_copy(config, "hydra"), "hydra.yaml", hydra_output)
            _save_config(config.hydra.overrides.task, "overrides.yaml", hydra_output)
        write_command(job.dir, config.hydra.runtime.cwd, job.command)

    def _refusal(self, job: _Job, schedule: DeviceSchedule) -> str | None:
        """Why the job cannot start on this pool (several nodes, more GPUs than it has), or None."""
        devices = OmegaConf.select(job.task_cfg, "trainer.devices", default=1)
        nodes = OmegaConf.select(job.task_cfg, "trainer.num_nodes", default=1)
        if isinstance(nodes, int) and nodes > 1:
            return f"trainer.num_nodes={nodes}: the local pool is one machine; use hydra/launcher=slurm"
        if not schedule.fits_ever(job.need):
            return (
                f"the job needs {job.need} devices (trainer.devices={devices}) and the pool has "
                f"{schedule.size} ({','.join(schedule.ids)}): set hydra.launcher.devices"
            )
        return None

    def _entry_module(self) -> str:
        """The module whose command the jobs run: the one that defines the task function."""
        module = getattr(self.task_function, "__module__", None) or "litlab.cli.train"
        if module == "__main__":  # started as python -m litlab.cli.train
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            module = spec.name if spec is not None else "litlab.cli.train"
        return module

    @staticmethod
    def _completed(task_cfg: DictConfig, hydra_cfg: DictConfig, identity: str) -> dict[str, Any] | None:
        """The summary of the job's run where it completed under this code (as ``resume=auto`` decides)."""
        from litlab.config.identity import found_in_storage

        if str(task_cfg.get("resume")) != "auto":
            return None
        found = found_in_storage(task_cfg, hydra_cfg, identity)
        return found.completed_summary if found is not None else None

    def _look_beside(self) -> None:
        """Other processes' runs training on this machine beside the jobs (locks in their storage roots)."""
        from litlab.storage.lock import LOCK_SUFFIX, held_by_another
        from litlab.storage.roots import RunStorage

        ours = {job.identity for job in self._running.values()}
        for root in {job.storage.root for job in self._running.values() if job.storage is not None}:
            for path in Path(root).glob(f"*{LOCK_SUFFIX}"):
                identity = path.name.removesuffix(LOCK_SUFFIX)
                holder = None if identity in ours else held_by_another(RunStorage(root, identity))
                if holder is not None and holder.host == socket.gethostname():
                    for job in self._running.values():
                        job.beside.add(f"{identity} (pid {holder.pid})")

    def _start(self, job: _Job, schedule: DeviceSchedule) -> None:
        from litlab.launch.multirun import job_summary
        from litlab.run import sweep_record
        from litlab.run.summary import RUNNING, SWEEP_JOB_ENV, now
        from litlab.storage.lock import HANDOVER_ENV

        job.taken = schedule.take(job.need)
        cores = job.taken.cores
        job.start, job.start_s, job.started_at = _utc_now(), time.monotonic(), now()
        for other in self._running.values():
            other.beside.add(job.index)
            job.beside.add(other.index)
        self._write_job_files(job)
        sweep_record.list_job(Path(str(job.config.hydra.sweep.dir)), job.index, job.dir)
        running = job_summary(job.task_cfg, job.dir, None, RUNNING, started_at=job.started_at)
        self._record(job, running.to_dict(), RUNNING)
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1"}
        # The run's place in the sweep (its summary's ``sweep``); the rest is the pool's record.
        env[SWEEP_JOB_ENV] = json.dumps({"dir": str(job.config.hydra.sweep.dir), "job_num": job.index})
        if job.claim is not None:
            env[HANDOVER_ENV] = job.claim.token
        # Torch's threads: the job's cores split between its ranks; never more than the sweep's own.
        threads = max(1, len(cores) // max(1, job.need))
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
        env["OMP_NUM_THREADS"] = str(threads)
        if schedule.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(job.taken.ids)
        with open(job.dir / "output.log", "ab") as output:  # the job's process holds its own copy
            job.process = subprocess.Popen(
                job.command,
                cwd=str(job.config.hydra.runtime.cwd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the sweep only; it stops the jobs with SIGTERM
                preexec_fn=_die_with_parent_and_pin(cores, os.getpid()),
            )
        self._running[job.index] = job
        if self._stopped is not None:  # stopped from a sweeper's own thread as it started
            self._terminate(job)
        where = f"device(s) {','.join(job.taken.ids)}, cores {','.join(map(str, cores))}"
        log.info(f"job {job.index} started on {where}: {job.dir / 'output.log'}")

    def _finish(self, job: _Job) -> JobReturn:
        """Record how the job ended (a failure its process did not write: in summary.json); its JobReturn."""
        from litlab.launch.multirun import record_failure
        from litlab.run import sweep_record
        from litlab.run.summary import FAILED, INTERRUPTED
        from litlab.storage.lock import give_back

        assert job.process is not None
        if job.claim is not None:  # its process never took the run's lock over (stopped as it started)
            give_back(job.storage, job.claim)
        job.end = _utc_now()
        returncode = job.process.returncode
        output = job.dir / "output.log"
        if returncode != 0:
            HydraConfig.instance().set_config(job.config)
            error = _error_line(output) or f"the job's process {describe_exit(returncode)} (see {output})"
            status = FAILED
            if self._stopped is not None:  # e.g. Ctrl-C while the job's process started
                error, status = f"the sweep was stopped by {self._stopped} as the job ran", INTERRUPTED
            record_failure(job.task_cfg, job.dir, error, status)
        stored = sweep_record.read_json(job.dir / "summary.json") or {}  # litlab-eval's jobs write none
        if stored:
            self._record(job, stored, *sweep_record.outcome_of(stored, job.started_at))
        status, took = stored.get("status"), time.monotonic() - job.start_s
        if status != FAILED:  # completed, interrupted (a signal), or an entry point's own outcome
            log.info("job %d %s in %.1f s", job.index, status or "ended", took)
        else:
            log.error("job %d %s after %.1f s: %s (%s)", job.index, status, took, stored.get("error"), output)
        return self._job_return(job, stored)

    def _job_return(self, job: _Job, summary: dict[str, Any]) -> JobReturn:
        ret = JobReturn()
        ret.cfg = job.task_cfg
        ret.hydra_cfg = job.config
        ret.overrides = typed_overrides(job.config.hydra.overrides.task)
        ret.working_dir = str(job.dir)
        ret.task_name = str(job.config.hydra.job.name)
        ret.status = JobStatus.COMPLETED  # a failed job is a failed row of the report, not the sweep's end
        metric = summary.get("optimized_metric")
        completed = summary.get("status") == "completed"
        ret.return_value = (summary.get("metrics") or {}).get(metric) if completed else None
        return ret


def task_config(config: DictConfig) -> DictConfig:
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def not_started(task_cfg: DictConfig, job_dir: Path, error: str, status: str = "failed", pool=None) -> Any:
    """A job that never started (HydraConfig: its config): a line in the log and a training job's row
    in the sweep's record (its run's folder is left as it was); its Summary."""
    from litlab.launch.multirun import job_summary, record_job
    from litlab.run.sweep_record import NOT_STARTED

    hydra = HydraConfig.get()
    log.error("job %d not started: %s", int(hydra.job.num), error)
    summary = job_summary(task_cfg, job_dir, error, status)
    if task_cfg.get("task_name") == "train":
        record_job(hydra, job_dir, summary.to_dict(), NOT_STARTED, None, pool)
    return summary


def _error_line(output: Path) -> str | None:
    """The last ``litlab: error:`` line of a job's output: why it stopped before writing a summary."""
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.removeprefix(ERROR_PREFIX) for line in lines if line.startswith(ERROR_PREFIX)]
    return errors[-1] if errors else None
