"""Storage that fails in the middle of a run, and two copies of one command at once.

A full local or mounted disk (a small tmpfs, mounted for the test) and an object store that stops
answering (each cloud's server of tests.object_stores, SIGSTOPped after some checkpoints) end the run
in one line naming the storage URL and the cause; no file or object under a checkpoint's name is
half-written, the previous checkpoint still loads, and once the storage is back the same command
resumes from it. A second copy
of a running command refuses in one line naming the holder of the run's lock.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from litlab.storage.resume import load_point
from tests.conftest import TINY, litlab, ok, run_dirs, start_litlab, summary

pytestmark = pytest.mark.slow

# 3 epochs of 4 batches, last.ckpt every 2 steps: several checkpoints, the best one each epoch.
RUN = [*TINY, "trainer.max_epochs=3", "callbacks.checkpoint.every_n_train_steps=2", "test_after_fit=false"]
RUN_TIMEOUT_S = 120


def one_line_failure(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 1, (
        f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("litlab: error: storage "), last
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    assert "][ERROR] storage " in result.stdout.strip().splitlines()[-1]  # the last line there too
    for word in words:
        assert word in last, last
    return last


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 600 KB tmpfs: room for two checkpoints of the default CNN (254 KB each), not three."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def assert_every_checkpoint_loads(folder: Path) -> list[Path]:
    checkpoints = sorted(folder.glob("*.ckpt"))
    assert checkpoints, f"no checkpoint in {folder}"
    for checkpoint in checkpoints:
        load_point(str(checkpoint))  # raises on a truncated file
    assert not list(folder.glob(".*.tmp")), "a temporary file was left behind"
    return checkpoints


@pytest.mark.parametrize("storage", ["local", "mounted"])
def test_full_disk_fails_in_one_line_keeps_the_last_checkpoint_and_resumes_once_there_is_room(
    log_dir, small_disk, storage
):
    command = ["litlab-train", *RUN, f"storage={storage}", f"storage.root={small_disk}"]
    result = litlab(*command, timeout=RUN_TIMEOUT_S)
    line = one_line_failure(result, str(small_disk), "no space left on device", "is intact")
    (folder,) = [p for p in small_disk.iterdir() if p.is_dir()]
    kept = re.search(r"the last checkpoint written, (\S+) \(step (\d+)\), is intact", line)
    assert kept and Path(kept.group(1)).parent == folder / "checkpoints", line
    assert_every_checkpoint_loads(folder / "checkpoints")
    assert load_point(kept.group(1)).global_step == int(kept.group(2))
    (first_run,) = run_dirs(log_dir)
    assert summary(first_run)["status"] == "failed" and summary(first_run)["error"] in line
    if storage == "mounted":
        return  # the same failure and the same files; resuming is the same as for local below

    subprocess.run(["mount", "-o", "remount,size=20m", str(small_disk)], check=True)  # room again
    resumed = ok(litlab(*command, timeout=RUN_TIMEOUT_S))
    assert re.search(r"resuming from \S+ \(epoch \d+, step (\d+)\)", resumed.stdout), resumed.stdout[-3000:]
    outcome = summary(run_dirs(log_dir)[-1])
    assert (outcome["status"], outcome["resumed_count"], outcome["global_step"]) == ("completed", 1, 12)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process stops answering (SIGSTOP) and answers again afterwards (SIGCONT), state intact."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_object_store_that_stops_answering_fails_after_bounded_retries_and_the_same_command_resumes(
    log_dir, object_store
):
    bucket = object_store.create_bucket("stops-answering")
    storage = [
        *object_store.storage(bucket, "runs"),
        "storage.max_attempts=2",  # a request fails after 2 tries of 1 s and a backoff of a few s
        "storage.timeout_s=1",
    ]
    run = [*RUN, *storage, "callbacks.progress.every_n_steps=1"]
    env = {"LITLAB_LOG_DIR": str(log_dir), **object_store.env()}
    process = start_litlab("litlab-train", *run, env=env, merge_stderr=False)
    assert process.stdout is not None
    for line in process.stdout:
        if re.search(r"\] epoch 1(?:/\d+)? step 6:", line):  # last.ckpt written at steps 2, 4 and 6
            break
    with stopped(object_store.pid):
        began = time.monotonic()
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        took = time.monotonic() - began
    # The stated bound of one request, 2 tries of 1 s and a backoff (conf/storage/<name>.yaml), is
    # under 5 s on every store (measured: 3-5 s to the run's end); the rest is for the run's ending.
    assert took < 15, f"the run ended {took:.1f} s after {object_store.name} stopped answering"
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    root = f"{object_store.scheme}://{bucket}/runs/"
    one_line_failure(result, root, object_store.endpoint, "did not answer after 2 attempts")

    objects = object_store.objects(bucket)
    checkpoints = {key: data for key, data in objects.items() if key.endswith(".ckpt")}
    assert any(key.endswith("/last.ckpt") for key in checkpoints), sorted(objects)
    for data in checkpoints.values():  # every object under a checkpoint's name is whole
        torch.load(io.BytesIO(data), weights_only=True)
    resumed = ok(litlab("litlab-train", *run, env=object_store.env(), timeout=RUN_TIMEOUT_S))
    assert f"resuming from {object_store.scheme}://" in resumed.stdout
    outcome = summary(run_dirs(log_dir)[-1])
    assert (outcome["status"], outcome["resumed_count"], outcome["global_step"]) == ("completed", 1, 12)


def test_a_second_copy_of_a_running_command_refuses_naming_the_holder(log_dir):
    command = [*RUN, "trainer.max_epochs=50", "callbacks.progress.every_n_steps=1"]
    first = start_litlab("litlab-train", *command, env={"LITLAB_LOG_DIR": str(log_dir)})
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if "] epoch 0" in line and " step 2:" in line:
                break
        second = litlab("litlab-train", *command, timeout=30)  # refused by the preflight, before torch
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = second.stderr.strip().splitlines()
        host = socket.gethostname()
        assert re.fullmatch(
            rf"litlab: error: run default-\w+ is already running: {log_dir}/train/runs/default-\w+\.lock is "
            rf"held by pid {first.pid} on {re.escape(host)} since \S+ \(last heartbeat \d+ s ago\)"
            r"(, in [^;]+)?; "  # where the holder is, from its heartbeat record
            r".*run_name.*",
            line,
        ), line
        assert len(run_dirs(log_dir)) == 1, "the refused copy made no run directory"
    finally:
        first.kill()
        first.wait()
