"""The stacks a hang leaves (``stacks-rank<N>.txt``): this rank's threads and its child processes'
(DataLoader workers: the frame that hangs may be there), with py-spy; without it, the file says why."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from litlab.run import hangs

CHILD = """
import time

def a_worker_stuck_in_its_dataset():
    print("ready", flush=True)
    time.sleep(60)

a_worker_stuck_in_its_dataset()
"""


@pytest.fixture
def watchdog(tmp_path):
    watch = hangs.RankWatch(
        SimpleNamespace(hang_timeout=5, preempt_grace=0),
        SimpleNamespace(dir=tmp_path, resume_from=None),
        record_failure=lambda *a, **k: None,
    )
    return hangs.Watchdog(watch, SimpleNamespace(global_rank=0))


@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    time.sleep(0.2)  # in its sleep
    yield process
    process.kill()
    process.wait()


def test_the_stacks_of_a_hang_hold_the_child_processes_frames(watchdog, child, tmp_path):
    if hangs.shutil.which("py-spy", path=str(hangs.Path(sys.executable).parent)) is None:
        pytest.skip("py-spy is not installed (pyproject's dev extras)")
    watchdog.dump_stacks()
    stacks = (tmp_path / "stacks-rank0.txt").read_text()
    assert f"--pid {child.pid}" in stacks and "a_worker_stuck_in_its_dataset" in stacks, stacks


def test_without_py_spy_the_stacks_file_says_why_the_childrens_are_missing(
    watchdog, child, tmp_path, monkeypatch
):
    monkeypatch.setattr(hangs.shutil, "which", lambda *args, **kwargs: None)
    watchdog.dump_stacks()
    stacks = (tmp_path / "stacks-rank0.txt").read_text()
    assert "test_watchdog.py" in stacks  # this process's own threads, from faulthandler
    assert "py-spy is not installed" in stacks and str(child.pid) in stacks, stacks
