"""Slurm requeue on the real single-node test cluster: the requeue signal (SIGUSR1, what the batch
script's ``--signal=USR1@90`` sends before the time limit) stops both ranks at one batch boundary,
preempted.ckpt is written, rank 0 requeues the job, and the job, started again with the same id,
resumes in the same run folder. (The test cluster's slurm.conf shortens the
wait of a requeued job, ``cred_expire``, from Slurm's 120 s to 10 s.)"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import FAULTS_IMPORTABLE, TINY, ok, run_dirs, summary
from tests.faults import HOLD_AT_ENV
from tests.integration.test_slurm_launcher import (
    CPU_DDP,
    JOB_TIMEOUT_S,
    _wait_until_finished,
    submit_train_batch,
)
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def _wait_for(path: Path, pattern: str, cluster: SlurmCluster, job_id: str) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (path.exists() and re.search(pattern, path.read_text())):
        assert time.monotonic() < deadline, f"job {job_id}: no {pattern!r} in its output"
        assert cluster.run("squeue", "-h", "-j", job_id, timeout=30).stdout.strip(), path.read_text()[-3000:]
        time.sleep(0.5)


def test_requeue_signal_stops_both_ranks_requeues_the_job_and_it_resumes_in_its_run_directory(
    slurm_cluster: SlurmCluster, log_dir: Path, tmp_path: Path
):
    out = tmp_path / "job.out"
    args = [
        *CPU_DDP,
        *TINY,
        "trainer.limit_train_batches=10",  # each rank's whole epoch: 9 whole global batches of 2 x 64
        "trainer.max_epochs=2",
        "callbacks.checkpoint.every_n_train_steps=2",
        "callbacks.progress.every_n_steps=1",
    ]
    # Both ranks hold after step 5 until the signal comes (tests.faults.HoldAt): the tiny run would
    # otherwise end before scancel's signal arrives. The ranks agree on it at the next optimizer
    # step (in the non-finite guard's sum): both stop at step 6.
    hold = {**FAULTS_IMPORTABLE, HOLD_AT_ENV: "SIGUSR1:5"}
    job_id = submit_train_batch(
        slurm_cluster, out, *args, "+callbacks.hold._target_=tests.faults.HoldAt", env=hold
    )
    _wait_for(
        out, r"(?s)holding at step 5 until SIGUSR1.*holding at step 5 until SIGUSR1", slurm_cluster, job_id
    )
    ok(slurm_cluster.run("scancel", "--signal=USR1", job_id, timeout=30))  # to every task of the step

    state = _wait_until_finished(slurm_cluster, job_id)
    output = out.read_text()  # the batch script appends (--open-mode=append): both starts
    assert state == "COMPLETED", f"{state}\n{output[-4000:]}"
    assert f"requeued Slurm job {job_id}" in output, output[-4000:]
    stops = re.findall(r"\]\[rank (\d)\]\[litlab\]\[WARNING\] SIGTERM: stopped at global step (\d+)", output)
    assert sorted(stops) == [("0", "6"), ("1", "6")], stops
    (resumed,) = re.findall(
        r"\]\[rank 0\]\[litlab\]\[INFO\] resuming from (\S+) \(epoch \d+, step (\d+)\)", output
    )
    assert resumed[0].endswith("/checkpoints/preempted.ckpt") and resumed[1] == stops[0][1], resumed

    (run,) = run_dirs(log_dir)  # the same one, twice
    assert len(json.loads((run / "run.json").read_text())["starts"]) == 2
    outcome = summary(run)
    assert (outcome["status"], outcome["resumed_count"], outcome["world_size"]) == ("completed", 1, 2)
    assert outcome["cluster_environment"] == "SLURMEnvironment" and outcome["global_step"] == 18
