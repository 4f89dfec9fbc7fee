"""One process at a time trains a run identity: ``<root>/<identity>.lock``, created exclusively, holds
its holder's heartbeat record. A second start refuses in one line naming the holder; a lock whose process
is gone, or older than ``STALE_AFTER_S``, is taken over. Only global rank 0 takes it (docs/storage.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from litlab import heartbeat
from litlab.errors import LitlabError
from litlab.storage.roots import RunStorage, StorageError, failed_storage, write_atomic, write_text_atomic

log = logging.getLogger("litlab")

_HEARTBEAT_S = 30
STALE_AFTER_S = 120
LOCK_SUFFIX = ".lock"
# A sweep takes a run's lock before it starts the job that trains it; the job's process, given the
# token here, takes it over (two sweeps sharing a run: the second sees it held, never both train).
HANDOVER_ENV = "LITLAB_LOCK_HANDOVER"


class RunLocked(LitlabError):
    """Another process holds the lock of this run identity."""


@dataclass
class Holder:
    """What a second start and the pool read of the lock: its holder's heartbeat record, and more."""

    host: str
    pid: int
    started: str  # when the holder took the lock (ISO time, for people)
    heartbeat: float  # when it last said it is alive (POSIX time)
    token: str  # tells this holder's writes from a later one's
    process_started: float | None = None  # its process's start time (a reused pid is another process)
    pid_namespace: int | None = None  # whose pids (another container's, though of this host name)
    slurm_job: str | None = None
    where: str | None = None  # where its run is (``litlab.heartbeat.describe``)

    @classmethod
    def of_this_process(cls, started: str | None = None, token: str | None = None) -> Holder:
        started = started or dt.datetime.now().isoformat(timespec="seconds")
        return cls.of(heartbeat.record(started=started, token=token or secrets.token_hex(8)))

    @classmethod
    def of(cls, data: dict[str, Any]) -> Holder:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def stale_because(self) -> str | None:
        """Why this lock may be taken over; None while its holder may still be running."""
        if self.host == socket.gethostname() and self.pid_namespace in (None, heartbeat.pid_namespace()):
            if self.pid == os.getpid():
                return "it is this process's own"
            if not heartbeat.alive(self.pid, self.process_started):
                return f"its process {self.pid} is gone"
        if self.token == os.environ.get(HANDOVER_ENV):
            return "the sweep that started this job took it for it"
        if self.slurm_job is not None and self.slurm_job == heartbeat.slurm_job_id():
            return f"it is an earlier start of Slurm job {self.slurm_job}, requeued"
        age = time.time() - self.heartbeat
        if age > STALE_AFTER_S:
            return f"its last heartbeat is {age:.0f} s old (stale after {STALE_AFTER_S} s)"
        return None

    def describe(self) -> str:
        age = max(0.0, time.time() - self.heartbeat)
        where = f", in {self.where}" if self.where else ""
        return f"pid {self.pid} on {self.host} since {self.started} (last heartbeat {age:.0f} s ago){where}"


def lock_url(storage: RunStorage) -> str:
    return storage.url + LOCK_SUFFIX


def held_by_another(storage: RunStorage) -> Holder | None:
    """The live holder of the run's lock, if another process holds it (the preflight's check)."""
    holder = _read(storage)
    return holder if holder is not None and holder.stale_because() is None else None


def _refusal(storage: RunStorage, holder: Holder) -> str:
    return (
        f"run {storage.identity} is already running: {lock_url(storage)} is held by {holder.describe()}; "
        "wait for it to end or stop it, or give this run another run_name (two copies of one command, "
        "e.g. in a job array, would write the same checkpoints)"
    )


class RunLock:
    """The lock of one run identity, held by this process from ``acquire`` to ``release``."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage
        self.holder: Holder | None = None

    def acquire(self) -> None:
        """Take the lock, or raise RunLocked naming its holder."""
        self.holder = take(self.storage)
        heartbeat.watch(lock_url(self.storage), _HEARTBEAT_S, self._beat)

    def _beat(self) -> None:  # a job of the watchdog thread
        if self.holder is None or failed_storage(self.storage.url) is not None:
            return heartbeat.unwatch(lock_url(self.storage))
        try:
            current = _read(self.storage)
            if current is not None and current.token != self.holder.token:
                log.error("%s was taken over by %s", lock_url(self.storage), current.describe())
                return heartbeat.unwatch(lock_url(self.storage))
            self.holder = Holder.of_this_process(self.holder.started, self.holder.token)
            _write(self.storage, self.holder)
        except Exception as error:  # storage trouble shows where checkpoints are written
            if self.holder is not None and failed_storage(self.storage.url) is None:  # else said already
                log.warning("lock heartbeat not written to %s: %s", lock_url(self.storage), error)

    def release(self) -> None:
        heartbeat.unwatch(lock_url(self.storage))
        holder, self.holder = self.holder, None
        if holder is not None and failed_storage(self.storage.url) is None:
            give_back(self.storage, holder)


def take(storage: RunStorage) -> Holder:
    """Take the run's lock for this process (or a sweep, for its job), or raise RunLocked naming it."""
    me = Holder.of_this_process()
    if not _create(storage, me):
        holder = _read(storage)
        why = holder.stale_because() if holder is not None else "it cannot be read"
        if why is None:
            raise RunLocked(_refusal(storage, holder))
        if holder is None or holder.token != os.environ.get(HANDOVER_ENV):
            log.warning("taking over %s (%s)", lock_url(storage), why)
        _write(storage, me)
        now = _read(storage)  # another start may have taken it over at the same moment
        if now is None or now.token != me.token:
            raise RunLocked(_refusal(storage, now or me))
    return me


def give_back(storage: RunStorage, holder: Holder) -> None:
    """Remove the lock if ``holder`` still holds it (a job's process may have taken it over)."""
    with contextlib.suppress(Exception):  # a lock left behind is stale once this process is gone
        current = _read(storage)
        if current is not None and current.token == holder.token:
            storage.fs.rm_file(_lock_path(storage))


def _lock_path(storage: RunStorage) -> str:
    return f"{storage.path}{LOCK_SUFFIX}"


def _create(storage: RunStorage, holder: Holder) -> bool:
    """Write the lock if there is none; False if there is one."""
    data = json.dumps(asdict(holder)).encode()
    path = _lock_path(storage)
    try:
        if storage.is_local:
            write_atomic(Path(path), lambda file: file.write(data), exclusive=True)
        else:
            storage.fs.pipe_file(path, data, mode="create")  # S3: a conditional PUT (If-None-Match)
        return True
    except FileExistsError:
        return False
    except (TypeError, NotImplementedError, ValueError):  # a backend without exclusive writes
        if storage.fs.exists(path):
            return False
        storage.fs.pipe_file(path, data)
        return True


def _write(storage: RunStorage, holder: Holder) -> None:
    text = json.dumps(asdict(holder))
    if storage.is_local:
        write_text_atomic(Path(_lock_path(storage)), text)
    else:
        storage.fs.pipe_file(_lock_path(storage), text.encode())


def _read(storage: RunStorage) -> Holder | None:
    try:
        data: dict[str, Any] = json.loads(storage.fs.cat_file(_lock_path(storage)))
        return Holder.of(data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        log.warning("%s is not a litlab lock; it is replaced", lock_url(storage))
        return Holder(host="?", pid=-1, started="?", heartbeat=0.0, token="")


def check_not_locked(storage: RunStorage) -> None:
    """The preflight's check: StorageError (one line) when another process holds the run's lock."""
    holder = held_by_another(storage)
    if holder is not None:
        raise StorageError(_refusal(storage, holder))
