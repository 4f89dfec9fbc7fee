"""A rank that is alive but stuck ends the run in one line, and so does a preemption that cannot
reach a batch boundary; build-time refusals are one line.

Real processes: 2 gloo ranks under Lightning's launcher with a rank asleep in a step
(``tests.faults.SleepAt``) or a DataLoader worker that stops yielding
(``tests.faults.DigitsWithAStuckWorker``), a checkpoint write to the S3 server while it is stopped
(``tests.faults.StopProcessAt``), MLflow's own refusal of a file store. Each stuck run is given a
``hang_timeout`` of a few seconds; on main the same runs never end.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from litlab.storage.resume import load_point
from tests.conftest import FAULTS_IMPORTABLE, TINY, WARM, litlab, ok, run_dirs, start_litlab, summary

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 5
TWO_RANKS = ["trainer.devices=2", "strategy=ddp", "model=mlp"]
# 8 steps, a checkpoint every 2: a rank stuck at step 5 leaves last.ckpt of step 4.
STEPS = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=8",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_model_summary=false",
    "test_after_fit=false",
    "logger=csv",
    "callbacks.checkpoint.every_n_train_steps=2",
    "callbacks.progress.every_n_steps=1",
]
SLEEPER = "+callbacks.sleep_at._target_=tests.faults.SleepAt"
RUN_TIMEOUT_S = 180  # imports of 2 ranks on 2 busy cores, a few steps, the detection


def run_until(marker: str, args: list[str], env: dict[str, str], then=None) -> tuple[int, str, float]:
    """Start litlab-train in its own session, wait for a line containing ``marker``, call
    ``then(process)``, and return (status, output, seconds from the marker to the end). Every
    process of the session (every rank, every DataLoader worker) must be gone by then."""
    process = start_litlab("litlab-train", *args, env=env, new_session=True)
    seen = []
    assert process.stdout is not None
    marked = None
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            marked = time.monotonic()
            if then is not None:
                then(process)
            break
    seen.append(process.stdout.read())
    process.wait(timeout=RUN_TIMEOUT_S)
    ended = time.monotonic()
    output = "".join(seen)
    assert marked is not None, f"never reached {marker!r}:\n{output[-3000:]}"
    leftovers = [p for p in psutil.process_iter(["pid", "status", "cmdline"]) if _in_group(p, process.pid)]
    leftovers += WARM.job_children()  # warm ranks, in their server's session (tests/warm.py)
    for leftover in leftovers:
        leftover.kill()
    assert not leftovers, f"processes of the run outlived it: {[p.info for p in leftovers]}\n{output[-3000:]}"
    return process.returncode, output, ended - marked


def _in_group(process: psutil.Process, group: int) -> bool:
    """A live process (not a zombie waiting for its parent) in the process group ``group``."""
    try:
        return os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ProcessLookupError):
        return False


def env_for(log_dir: Path, **extra: str) -> dict[str, str]:
    return {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(log_dir), **extra}


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def checkpoint_step(log_dir: Path, name: str = "last.ckpt") -> int:
    (checkpoint,) = log_dir.glob(f"train/runs/*/checkpoints/{name}")
    return load_point(str(checkpoint)).global_step


@pytest.mark.parametrize(
    "hook",
    ["train_batch_end", "train_batch_start"],
    ids=["stuck-in-a-step", "stuck-before-a-collective"],
)
def test_a_stuck_rank_ends_every_rank_in_one_line_with_stacks_and_the_same_command_resumes(tmp_path, hook):
    log_dir = tmp_path / "logs"
    args = [*TWO_RANKS, *STEPS, SLEEPER, f"hang_timeout={HANG_TIMEOUT_S}"]
    env = env_for(log_dir, LITLAB_TEST_SLEEP_AT=f"1:{hook}:5")
    status, output, seconds = run_until("tests.faults: rank 1 sleeping", args, env)

    assert status == 1, output[-3000:]
    assert seconds < HANG_TIMEOUT_S + 60, seconds
    line = last_line(output)
    (run,) = run_dirs(log_dir)
    assert re.fullmatch(
        rf"litlab: error: rank 1 made no progress for \d+ s in training step 5 \(hang_timeout=5 s\); "
        rf"stacks of every thread: {re.escape(str(run))}/stacks-rank\*\.txt; every rank stopped; the last "
        r"checkpoint written, \S+/last\.ckpt \(step (\d)\), is intact: the same command resumes from it",
        line,
    ), line
    kept = int(line.rsplit("(step ", 1)[1].split(")")[0])
    assert "Traceback" not in output
    stacks = {rank: (run / f"stacks-rank{rank}.txt").read_text() for rank in (0, 1)}
    assert "tests/faults.py" in stacks[1] and "_maybe_sleep" in stacks[1], stacks[1][:2000]
    assert "litlab-watchdog" in stacks[0] or "Thread" in stacks[0]
    failed = summary(run)
    assert failed["status"] == "failed" and failed["error"] == line.removeprefix("litlab: error: ")
    # The last one written before the hang: rank 0 may have written step 6's while rank 1 slept.
    assert checkpoint_step(log_dir) == kept and kept >= 4

    if hook == "train_batch_end":  # once is enough: the same command, without the fault, resumes
        resumed = ok(litlab("litlab-train", *args, env=env_for(log_dir), timeout=RUN_TIMEOUT_S))
        assert re.search(rf"resuming from \S+/last\.ckpt .*step {kept}", resumed.stdout + resumed.stderr)
        assert summary(run_dirs(log_dir)[-1])["status"] == "completed"


def test_a_data_loader_worker_that_stops_yielding_is_named(tmp_path):
    log_dir = tmp_path / "logs"
    data = ["data._target_=tests.faults.DigitsWithAStuckWorker", f"hang_timeout={HANG_TIMEOUT_S}"]
    env = env_for(log_dir, LITLAB_TEST_STUCK_WORKER="1:5")
    status, output, seconds = run_until("step 3:", [*TWO_RANKS, *STEPS, *data], env)

    assert status == 1, output[-3000:]
    line = last_line(output)
    assert re.match(
        r"litlab: error: rank 1 made no progress for \d+ s in waiting for data \(before training step \d\)",
        line,
    ), line
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "failed"
    stacks = (run / "stacks-rank1.txt").read_text()
    # The frame that hangs is in the worker process, not in the rank waiting on its queue.
    assert "sleep_while_parent_lives" in stacks, stacks[-3000:]


def test_a_checkpoint_write_to_a_stalled_s3_server_is_named_and_the_same_command_resumes(tmp_path, s3_server):
    log_dir = tmp_path / "logs"
    bucket = s3_server.create_bucket("stalls")
    server = s3_server.pid
    args = [
        "model=mlp",
        *STEPS,
        "storage=s3",
        f"storage.root=s3://{bucket}/runs",
        f"storage.endpoint_url={s3_server.endpoint}",
        f"hang_timeout={HANG_TIMEOUT_S}",
        "+callbacks.stop_server._target_=tests.faults.StopProcessAt",
    ]
    env = {**env_for(log_dir, LITLAB_TEST_SIGSTOP_AT=f"{server}:6"), **s3_server.env()}
    try:
        status, output, seconds = run_until("tests.faults: SIGSTOP", args, env)
    finally:
        os.kill(server, signal.SIGCONT)

    assert status == 1, output[-3000:]
    line = last_line(output)
    assert re.match(
        r"litlab: error: the run made no progress for \d+ s in checkpoint write at global step 6, "
        r"[\d.]+ (MiB|bytes) written, uploading [\d.]+ (MiB|bytes) \(hang_timeout=5 s\); stacks of every "
        r"thread: \S+/stacks-rank0\.txt; every rank stopped; the last checkpoint written, "
        rf"s3://{bucket}/runs/\S+/last\.ckpt \(step 4\), is intact",
        line,
    ), line
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "failed"
    for key, data in s3_server.objects(bucket).items():  # every checkpoint whole
        if key.endswith(".ckpt"):
            torch.load(io.BytesIO(data), weights_only=True)
    resumed = ok(litlab("litlab-train", *args, env={**env_for(log_dir), **s3_server.env()}))
    assert "resuming from s3://" in resumed.stdout + resumed.stderr
    assert summary(run_dirs(log_dir)[-1])["status"] == "completed"


def test_sigterm_with_a_stuck_rank_exits_143_within_the_grace(tmp_path):
    log_dir = tmp_path / "logs"
    grace = 3
    args = [*TWO_RANKS, *STEPS, SLEEPER, "hang_timeout=0", f"preempt_grace={grace}"]
    env = env_for(log_dir, LITLAB_TEST_SLEEP_AT="1:train_batch_end:5")

    def preempt(process) -> None:
        time.sleep(1)  # rank 0 is waiting in the next step's collective
        process.send_signal(signal.SIGTERM)

    status, output, seconds = run_until("tests.faults: rank 1 sleeping", args, env, then=preempt)

    assert status == 143, output[-3000:]
    assert seconds < 1 + grace + 40, seconds  # the grace, then stacks and the children's exit
    line = last_line(output)
    assert re.match(
        r"litlab: error: SIGTERM: the ranks did not reach a common batch boundary within preempt_grace=3 s "
        r"\(rank 1 is in training step 5\); .*; no preempted checkpoint was written; the next attempt "
        r"resumes from \S+/last\.ckpt \(step \d\)$",
        line,
    ), line
    assert f"(step {checkpoint_step(log_dir)})" in line  # the newest, intact: rank 0 wrote it before waiting
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "interrupted"
    assert not list(log_dir.glob("**/checkpoints/preempted.ckpt"))


def test_a_run_that_blocks_while_stopping_for_sigterm_exits_143_naming_its_checkpoint(tmp_path):
    # One process: SIGTERM at step 3, preempted.ckpt written, then a call that never returns (a store
    # whose host is gone). The run still ends, within the grace, and the same command resumes.
    log_dir = tmp_path / "logs"
    grace = 3
    hold, block = (
        "+callbacks.hold._target_=tests.faults.HoldAt",
        "+callbacks.block._target_=tests.faults.BlockWhileStopping",
    )
    args = ["model=mlp", *STEPS, hold, block, f"preempt_grace={grace}"]
    env = env_for(log_dir, LITLAB_TEST_HOLD_AT="SIGTERM:3")

    status, output, seconds = run_until(
        "tests.faults: holding at step 3", args, env, then=lambda p: p.send_signal(signal.SIGTERM)
    )

    assert status == 143, output[-3000:]
    assert "tests.faults: blocking while stopping" in output
    assert seconds < grace + 40, seconds  # the grace, then stacks and summary.json
    line = last_line(output)
    assert re.match(
        r"litlab: error: SIGTERM: the run stopped at global step 3 but did not end within preempt_grace=3 s; "
        r"stacks of every thread: \S+/stacks-rank0\.txt; the next attempt resumes from \S+/preempted\.ckpt "
        r"\(step 3\)$",
        line,
    ), line
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "interrupted"
    stacks = (run / "stacks-rank0.txt").read_text()
    assert 'tests/faults.py", line' in stacks and "in on_exception" in stacks, stacks[:3000]  # the block
    assert checkpoint_step(log_dir, "preempted.ckpt") == 3

    resumed = litlab("litlab-train", *args, env=env_for(log_dir))
    ok(resumed)
    assert summary(run_dirs(log_dir)[-1])["resumed_count"] == 1


def test_a_second_sigterm_while_the_run_stops_does_not_end_it_before_its_summary(tmp_path):
    # A sweep job gets SIGTERM once per thread of its dying sweep (PR_SET_PDEATHSIG): one may come
    # after Lightning's teardown put back the default action, before summary.json is written.
    log_dir = tmp_path / "logs"
    again = "+callbacks.again._target_=tests.faults.SigtermAgainWhileStopping"
    args = ["model=mlp", *STEPS, "+callbacks.hold._target_=tests.faults.HoldAt", again]
    env = env_for(log_dir, LITLAB_TEST_HOLD_AT="SIGTERM:3")

    status, output, _ = run_until(
        "tests.faults: holding at step 3", args, env, then=lambda p: p.send_signal(signal.SIGTERM)
    )

    assert status == 143, output[-3000:]
    assert (
        "tests.faults: SIGTERM again" in output
        and "SIGTERM again on rank 0: the run is already stopping" in output
    )
    assert "SIGTERM: stopped at global step 3, exiting with status 143" in output
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "interrupted"
    assert checkpoint_step(log_dir, "preempted.ckpt") == 3


def test_a_logger_that_refuses_its_tracking_uri_fails_in_one_line(tmp_path):
    log_dir = tmp_path / "logs"
    uri = f"file://{tmp_path}/mlruns"
    env = {"LITLAB_LOG_DIR": str(log_dir), "MLFLOW_TRACKING_URI": uri}
    result = litlab("litlab-train", "model=mlp", *TINY[:-1], "logger=mlflow", env=env)

    assert result.returncode == 2, result.stderr[-3000:]
    line = last_line(result.stderr)
    assert line.startswith(f"litlab: error: logger=mlflow: MLflow refuses the tracking URI {uri}: "), line
    assert "MLFLOW_TRACKING_URI=sqlite:///" in line
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "failed"
    assert not list(log_dir.glob("**/*.ckpt"))
