"""Where this rank is in its run (``HEARTBEAT``), its ``record``, and the process's one watchdog thread
(``watch``: ``litlab.run.hangs``, the run lock's refresh). The loop's hooks only set attributes (no I/O,
no lock); ranks run the same hooks in order, so the rank with the fewest beats is the one others wait for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import IO, Any

import psutil

log = logging.getLogger("litlab")

# The phases a stuck rank is named by.
STARTING = "starting"  # from setup to the first batch: strategy setup, restoring a checkpoint
TRAINING = "training step"
VALIDATION = "validation"
CHECKPOINT = "checkpoint write"
DATA = "waiting for data"  # from the end of a batch's hooks to the next batch's arrival
TESTING = "testing"

_FIRST_ALLOWANCE = 3  # times hang_timeout for a first step or validation: compiling, cudnn benchmarks
_UPLOAD_BYTES_PER_S = 10 * 2**20  # an object-store upload's allowance grows with its size at this rate


@dataclass(frozen=True)
class State:
    """One rank's position: replaced whole by every beat, so a reader never sees half of one."""

    phase: str = STARTING
    step: int = 0  # the global step in progress (training) or reached (the others)
    beats: int = 0
    first: bool = True  # a first step or validation since the process started fitting
    bytes_written: int = 0  # of the checkpoint being written
    upload_bytes: int = 0  # of an upload that reports no progress of its own (one object-store PUT)


class Heartbeat:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.state, self.at = State(), time.monotonic()  # at: of the last progress

    def beat(self, phase: str, step: int, first: bool = False) -> None:
        self.state, self.at = State(phase, step, self.state.beats + 1, first), time.monotonic()

    def wrote(self, nbytes: int) -> None:
        """Progress of a checkpoint write, in bytes: a large checkpoint is slow, not stuck."""
        self.state = replace(self.state, bytes_written=self.state.bytes_written + nbytes)
        self.at = time.monotonic()

    def uploading(self, nbytes: int) -> None:
        self.state, self.at = replace(self.state, upload_bytes=nbytes), time.monotonic()

    @contextlib.contextmanager
    def writing_checkpoint(self, step: int) -> Iterator[None]:
        """The block writes the checkpoint of ``step``; then the rank is back where it was (not a beat:
        only the ranks that write checkpoints get here)."""
        before = self.state
        self.state, self.at = State(CHECKPOINT, step, before.beats, before.first), time.monotonic()
        try:
            yield
        finally:
            self.state, self.at = before, time.monotonic()


HEARTBEAT = Heartbeat()  # this process's: one rank per process


_WORDS = {
    TRAINING: "training step {step}",
    DATA: "waiting for data (before training step {step})",
    CHECKPOINT: "checkpoint write at global step {step}",
    VALIDATION: "validation at global step {step}",
    STARTING: "starting (before training step {step}: setup, checkpoint restore, first batch)",
}


def describe(state: State) -> str:
    """The phase in words, as the stuck rank's line names it."""
    words = _WORDS.get(state.phase, "{phase} after global step {step}").format(**asdict(state))
    if state.bytes_written:
        words += f", {_size(state.bytes_written)} written"
    return words + (f", uploading {_size(state.upload_bytes)}" if state.upload_bytes else "")


def allowance(state: State, hang_timeout: float) -> float:
    """Seconds without progress after which this rank counts as stalled."""
    factor = _FIRST_ALLOWANCE if state.first or state.phase == STARTING else 1
    return hang_timeout * factor + state.upload_bytes / _UPLOAD_BYTES_PER_S


def order(state: State) -> tuple[int, int]:
    """Sort key of the ranks' states: the first is the rank the others wait for (fewest beats; at a
    tie, the one writing a checkpoint or waiting for data: the others wait at the next collective)."""
    return (state.beats, 0 if state.phase in (CHECKPOINT, DATA) else 1)


class CountingWriter:
    """A file object that reports every write's bytes to the heartbeat (torch.save writes through it)."""

    def __init__(self, file: IO[bytes], heartbeat: Heartbeat = HEARTBEAT) -> None:
        self.file, self.heartbeat = file, heartbeat

    def write(self, data: Any) -> int:
        written = self.file.write(data)
        self.heartbeat.wrote(len(data) if written is None else written)
        return written

    def __getattr__(self, name: str) -> Any:  # flush, fileno, tell, seek... of the wrapped file
        return getattr(self.file, name)


def alive(pid: int, started: float | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie does not) and, with ``started`` (its start time), is
    still that process, not a later one that reused the pid."""
    try:
        process = psutil.Process(pid)
        same = started is None or abs(process.create_time() - started) < 1.0
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def slurm_job_id() -> str | None:
    """This process's Slurm job as squeue names it (``<array job>_<task>`` for an array task)."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")


def pid_namespace() -> int | None:
    """This process's pid namespace (None off Linux): containers that share a host name (host
    networking) each number their processes on their own."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def record(**more: Any) -> dict[str, Any]:
    """This rank's heartbeat record: who (host, pid, Slurm job), where (``HEARTBEAT``'s state, also in
    words), when (``heartbeat``, POSIX time); for heartbeat-rank<N>.json, the ranks' store, the run lock."""
    if not _this_process:  # read once per process (a forked child forgets its parent's)
        _this_process.update(
            host=socket.gethostname(),
            pid=os.getpid(),
            process_started=psutil.Process().create_time(),
            pid_namespace=pid_namespace(),
        )
    state = HEARTBEAT.state
    return {
        **_this_process,
        "slurm_job": slurm_job_id(),
        **asdict(state),
        "where": describe(state),
        "heartbeat": time.time(),
        **more,
    }


_this_process: dict[str, Any] = {}  # the facts of its record that never change
_jobs: dict[str, tuple[float, Callable[[], None]]] = {}  # name -> (seconds between calls, job)
_due: dict[str, float] = {}  # name -> when its job is called next
_thread: threading.Thread | None = None
_wake = threading.Event()  # a job added: the thread looks again at once


def watch(name: str, every_s: float, job: Callable[[], None]) -> None:
    """Call ``job`` about every ``every_s`` seconds in this process's one watchdog thread (started on
    first use), until ``unwatch(name)``; a job of the same name is replaced."""
    global _thread
    _jobs[name], _due[name] = (every_s, job), time.monotonic() + every_s
    _wake.set()
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_run, name="litlab-watchdog", daemon=True)
        _thread.start()


def unwatch(name: str, job: Callable[[], None] | None = None) -> None:
    """No more calls of the job ``name`` (only if it is still ``job``, when given)."""
    if job is None or _jobs.get(name, (0.0, None))[1] == job:
        _jobs.pop(name, None)


def _forget_the_parent() -> None:
    """In a forked child (a ``ddp_notebook`` rank, a DataLoader worker) the parent's watchdog thread and
    jobs are not its own; a new event, as the parent's thread may have held its lock at the fork."""
    global _thread, _wake
    _this_process.clear()
    _jobs.clear()
    _due.clear()
    _thread, _wake = None, threading.Event()


os.register_at_fork(after_in_child=_forget_the_parent)


def _run() -> None:
    while True:  # idle, not ended, without jobs: a job added as it would end would never run
        _wake.wait(min((every_s for every_s, _ in list(_jobs.values())), default=1.0))
        _wake.clear()
        for name, (every_s, job) in list(_jobs.items()):
            if name not in _jobs or time.monotonic() < _due.get(name, 0.0) - every_s * 0.1:
                continue  # unwatched by the job before it, or not due
            _due[name] = time.monotonic() + every_s
            try:
                job()
            except Exception as error:  # a watchdog must never be what ends a healthy run
                log.debug("watchdog: %s failed: %s", name, error, exc_info=True)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} bytes"
