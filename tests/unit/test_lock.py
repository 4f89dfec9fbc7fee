"""The run lock (``litlab.storage.lock``) in a local storage root: who may take it over, and when."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litlab import heartbeat
from litlab.storage.lock import (
    HANDOVER_ENV,
    STALE_AFTER_S,
    Holder,
    RunLock,
    RunLocked,
    check_not_locked,
    give_back,
    lock_url,
)
from litlab.storage.roots import RunStorage, StorageError


@pytest.fixture
def storage(tmp_path) -> RunStorage:
    return RunStorage(str(tmp_path / "root"), "default-0123456789")


def write_lock(storage: RunStorage, **fields) -> None:
    holder = {"host": "another-machine", "pid": 4242, "started": "2026-12-01T10:00:00", "token": "theirs"}
    holder.update({"heartbeat": time.time(), **fields})
    path = Path(lock_url(storage))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder))


def test_the_lock_lives_in_the_storage_root_and_is_released(storage):
    lock = RunLock(storage)
    lock.acquire()
    stored = json.loads(Path(lock_url(storage)).read_text())
    assert lock_url(storage) == f"{storage.root}/{storage.identity}.lock"
    assert stored["pid"] == lock.holder.pid and stored["host"] == lock.holder.host and stored["started"]
    lock.release()
    assert not Path(lock_url(storage)).exists()


def test_a_live_holder_on_another_machine_is_named_and_refused(storage):
    write_lock(storage)
    with pytest.raises(RunLocked) as refused:
        RunLock(storage).acquire()
    line = str(refused.value)
    assert "is held by pid 4242 on another-machine since 2026-12-01T10:00:00 (last heartbeat 0 s ago)" in line
    assert "run_name" in line
    with pytest.raises(StorageError, match="is already running"):  # the preflight's check, the same line
        check_not_locked(storage)


def test_a_lock_whose_heartbeat_stopped_is_taken_over(storage, caplog):
    write_lock(storage, heartbeat=time.time() - STALE_AFTER_S - 1)
    lock = RunLock(storage)
    lock.acquire()
    assert json.loads(Path(lock_url(storage)).read_text())["token"] == lock.holder.token
    assert "stale after 120 s" in caplog.text
    lock.release()


def test_a_lock_of_a_killed_process_on_this_machine_is_taken_over_at_once(storage):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(storage, host=socket.gethostname(), pid=dead.pid)
    check_not_locked(storage)  # the preflight lets it through
    lock = RunLock(storage)
    lock.acquire()
    lock.release()


def test_a_requeued_slurm_job_takes_over_its_own_lock(storage, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    write_lock(storage, slurm_job="77")  # on another node, its heartbeat still fresh
    lock = RunLock(storage)
    lock.acquire()
    lock.release()
    write_lock(storage, slurm_job="78")  # another job: refused
    with pytest.raises(RunLocked):
        RunLock(storage).acquire()


def test_a_file_that_is_not_a_lock_is_replaced(storage):
    write_lock(storage)
    Path(lock_url(storage)).write_text("not json")
    lock = RunLock(storage)
    lock.acquire()
    lock.release()


def test_release_leaves_a_lock_someone_else_took_over(storage):
    lock = RunLock(storage)
    lock.acquire()
    write_lock(storage)  # taken over while this process was away
    lock.release()
    assert json.loads(Path(lock_url(storage)).read_text())["token"] == "theirs"


def test_the_holder_of_a_reused_pid_is_another_process(storage):
    write_lock(storage, host=socket.gethostname(), pid=1, process_started=1.0)
    assert (
        Holder(**json.loads(Path(lock_url(storage)).read_text())).stale_because() == "its process 1 is gone"
    )


@pytest.mark.parametrize("pid", ["ours", 1], ids=["our pid", "a pid that runs here"])
def test_a_live_holder_in_another_container_of_this_host_name_is_refused(storage, pid):
    """Containers with the host's name (host networking) each have their own pids, often pid 1: a
    lock of another container matched this process (taken over as its own) or a process of ours
    with another start time (taken over as gone), while its holder trained on."""
    elsewhere = heartbeat.pid_namespace() + 1  # another container's pid namespace
    pid = os.getpid() if pid == "ours" else pid
    write_lock(storage, host=socket.gethostname(), pid=pid, process_started=1.0, pid_namespace=elsewhere)
    with pytest.raises(RunLocked, match=f"is held by pid {pid} on {socket.gethostname()}"):
        RunLock(storage).acquire()


def test_an_array_task_names_itself_one_way_in_its_lock_and_its_requeue(storage, monkeypatch):
    # Slurm gives an array task a job id of its own; squeue and scontrol name it <array job>_<task>.
    monkeypatch.setenv("SLURM_JOB_ID", "1043")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1040")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    from litlab.run import hangs

    requeued = []
    monkeypatch.setattr(
        hangs.subprocess,
        "run",
        lambda command, **_: requeued.append(command) or subprocess.CompletedProcess(command, 0),
    )
    hangs._requeue_this_job()
    lock = RunLock(storage)
    lock.acquire()
    try:
        assert json.loads(Path(lock_url(storage)).read_text())["slurm_job"] == "1040_3"
        assert requeued == [["scontrol", "requeue", "1040_3"]]
    finally:
        lock.release()


def test_a_heartbeat_that_fails_once_the_run_has_ended_says_nothing(storage, monkeypatch, caplog):
    # The watchdog's beat waits on a store that stopped answering; the run ends meanwhile with its one
    # line (the lock released), then the beat fails: that line must stay the last.
    lock = RunLock(storage)
    lock.acquire()

    def read_failing_after_the_run_ended(path: str) -> bytes:
        if lock.holder is not None:
            lock.release()
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(storage.fs, "cat_file", read_failing_after_the_run_ended)
    lock._beat()
    assert "lock heartbeat" not in caplog.text


def test_a_sweeps_claim_is_taken_over_by_its_jobs_process_alone_and_quietly(storage, monkeypatch, caplog):
    """The pool takes the lock before it starts the job (another sweep sharing the run then sees it
    held); the job's process, given the claim's token, takes it over without a warning."""
    write_lock(storage, token="the-sweeps", host=socket.gethostname(), pid=1)  # pid 1: alive, not ours
    with pytest.raises(RunLocked):  # any other process: held
        RunLock(storage).acquire()
    monkeypatch.setenv(HANDOVER_ENV, "the-sweeps")
    job = RunLock(storage)
    job.acquire()
    assert json.loads(Path(lock_url(storage)).read_text())["token"] == job.holder.token
    assert "taking over" not in caplog.text
    give_back(storage, Holder.of(json.loads(json.dumps({**vars(job.holder), "token": "the-sweeps"}))))
    assert Path(lock_url(storage)).is_file()  # the sweep's give_back leaves its job's lock
    job.release()
