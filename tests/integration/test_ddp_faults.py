"""A 2-rank run (Lightning's ddp launcher, gloo on CPU) that is killed, preempted, or loses a rank.

Interruptions resume exactly: the run below is SIGKILLed as a whole, then preempted by a SIGTERM to
its launching process, then by a SIGTERM to rank 1 alone, and every time the same command continues
it; its final weights and optimizer state are bitwise equal to an uninterrupted 2-rank run's. A rank
that dies or raises stops every rank in one line naming the rank and the cause, long before the
30-minute collective timeout (each command gets ``FAULT_TIMEOUT_S`` in all, imports included).
Faults come from ``tests.faults.MLPFailingOnOneRank`` (``LITLAB_TEST_FAULT``); without that variable
it is the plain MLP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
import torch

from litlab.storage.resume import load_point
from tests.conftest import FAULTS_IMPORTABLE, TEST_SEED, TINY, litlab, ok, run_dirs, summary
from tests.integration.test_resume import (
    ARGS,
    CHECKPOINT_EVERY,
    assert_same_tensors,
    final_state,
    interrupt_at,
    local_last_checkpoint,
    random_step,
    resumed_from,
    storage_folder,
    valid_checkpoints,
)
from tests.warm import WarmProcess

pytestmark = pytest.mark.slow

TWO_RANKS = ["trainer.devices=2", "strategy=ddp", "model=mlp"]
FAILING_NET = "tests.faults.MLPFailingOnOneRank"
FAULT_TIMEOUT_S = 120  # a whole tiny 2-rank run: imports (~15 s on 2 cores), training, the failure


def env_for(log_dir: Path, **extra: str) -> dict[str, str]:
    return {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(log_dir), **extra}


def to_every_rank(process: WarmProcess, sig: signal.Signals) -> None:
    os.killpg(process.pid, sig)


def to_rank_1(process: WarmProcess, sig: signal.Signals) -> None:
    (child,) = psutil.Process(process.pid).children()  # the rank Lightning's launcher started
    child.send_signal(sig)


def stop_lines(output: str) -> dict[str, int]:
    """``rank -> global step`` of each rank's "SIGTERM: stopped at global step N" line."""
    found = {}
    for line in output.splitlines():
        if "SIGTERM: stopped at global step" in line:
            rank = line.split("][rank ", 1)[1].split("]", 1)[0]
            found[rank] = int(line.split("global step ")[1].split(",")[0])
    return found


@pytest.fixture(scope="module")
def uninterrupted_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    log_dir = tmp_path_factory.mktemp("uninterrupted-ddp") / "logs"
    ok(litlab("litlab-train", *ARGS, *resume_args(), env=env_for(log_dir)))
    return final_state(local_last_checkpoint(log_dir))


def resume_args() -> list[str]:
    """test_resume's run (2 epochs of 10 batches, checkpoints every 2 steps), on 2 ranks."""
    return [*TWO_RANKS, f"model.net._target_={FAILING_NET}"]


def test_ddp_run_killed_then_preempted_twice_resumes_bitwise_equal(uninterrupted_two_ranks, tmp_path):
    log_dir = tmp_path / "logs"
    env = env_for(log_dir)
    kill_step = random_step(high=8)
    status, _ = interrupt_at(kill_step, signal.SIGKILL, env, *resume_args(), send=to_every_rank)
    assert status == -signal.SIGKILL, f"SIGKILL of every rank at step {kill_step} (TEST_SEED={TEST_SEED})"
    # Killed from outside, at a step the progress log had reached: where it stopped is known from
    # the files it left, and the next start must take the newest of them that loads.
    valid = valid_checkpoints(storage_folder(log_dir) / "checkpoints")

    # The same command resumes; SIGTERM to the launching process, as a spot VM or Slurm sends it.
    status, output = interrupt_at(kill_step + 4, signal.SIGTERM, env, *resume_args())
    assert status == 128 + signal.SIGTERM, output[-3000:]
    url, _, resumed_step = resumed_from(output)
    assert valid and max(valid.values()) >= kill_step - CHECKPOINT_EVERY, (kill_step, valid)
    assert resumed_step == max(valid.values()) == valid[Path(url)], f"killed at step {kill_step}: {valid}"
    preempted = storage_folder(log_dir) / "checkpoints" / "preempted.ckpt"
    stopped = stop_lines(output)
    assert set(stopped) == {"0", "1"} and len(set(stopped.values())) == 1, stopped  # one batch boundary
    assert load_point(str(preempted)).global_step == stopped["0"]
    stored = json.loads((storage_folder(log_dir) / "summary.json").read_text())
    assert (stored["status"], stored["resumed_count"]) == ("interrupted", 1)

    # Again, SIGTERM to rank 1 only: it tells the others, and all stop after the same batch.
    status, output = interrupt_at(stopped["0"] + 3, signal.SIGTERM, env, *resume_args(), send=to_rank_1)
    assert status == 128 + signal.SIGTERM, output[-3000:]
    url, _, resumed_step = resumed_from(output)
    assert Path(url) == preempted and resumed_step == stopped["0"]
    stopped_again = stop_lines(output)
    assert set(stopped_again) == {"0", "1"} and len(set(stopped_again.values())) == 1, stopped_again
    assert load_point(str(preempted)).global_step == stopped_again["0"]

    result = ok(litlab("litlab-train", *ARGS, *resume_args(), env=env))
    assert resumed_from(result.stdout)[2] == stopped_again["0"]
    assert_same_tensors(uninterrupted_two_ranks, final_state(local_last_checkpoint(log_dir)), f"{kill_step}")
    outcome = summary(run_dirs(log_dir)[-1])
    assert (outcome["status"], outcome["resumed_count"], outcome["world_size"]) == ("completed", 3, 2)
    assert not preempted.exists()


def fault_run(log_dir: Path, fault: str, *args: str, net: str = FAILING_NET) -> subprocess.CompletedProcess:
    tiny = [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=8",
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
        "test_after_fit=false",
        "logger=csv",
        "callbacks.checkpoint.every_n_train_steps=2",
    ]
    env = env_for(log_dir, LITLAB_TEST_FAULT=fault)
    command = [*TWO_RANKS, f"model.net._target_={net}", *tiny, *args]
    return litlab("litlab-train", *command, env=env, timeout=FAULT_TIMEOUT_S)


@pytest.mark.parametrize(
    ("fault", "args", "cause"),
    [
        ("kill@1:6", [], r"rank 1 \(pid \d+ on \S+\) was killed by SIGKILL at global step 5"),
        ("raise@1:6", [], r"rank 1 failed at global step 5: RuntimeError: injected failure on rank 1"),
        # Out of memory on one rank only: oom=auto_shrink must not shrink that rank alone.
        (
            "oom@1:6",
            ["oom=auto_shrink", "oom.within_steps=100"],
            r"rank 1: out of memory at global step 5 with micro-batch 64 \(CUDA .*\) on rank 1 only",
        ),
    ],
    ids=["sigkill", "exception", "out-of-memory"],
)
def test_a_rank_that_dies_or_raises_stops_every_rank_in_one_line(tmp_path, fault, args, cause):
    log_dir = tmp_path / "logs"
    result = fault_run(log_dir, fault, *args)  # a hang until the collective timeout would time out here
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(f"litlab: error: {cause}.*; every rank stopped; ", last), last
    assert "last.ckpt (step 4), is intact" in last and "last.ckpt (step 4), is intact" in last, last
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    (run,) = run_dirs(log_dir)
    failed = summary(run)
    assert failed["status"] == "failed" and failed["error"] == last.removeprefix("litlab: error: ")
    checkpoints = storage_folder(log_dir) / "checkpoints"
    assert load_point(str(checkpoints / "last.ckpt")).global_step == 4  # the last good one, resumable
    assert not list(checkpoints.glob(".*.tmp")), "nothing half-written"


def test_auto_shrink_under_ddp_shrinks_every_rank_together(tmp_path):
    log_dir = tmp_path / "logs"
    ok(
        fault_run(
            log_dir, "", "oom=auto_shrink", "data.batch_size=64", net="tests.faults.MLPOutOfMemoryAbove32"
        )
    )
    outcome = summary(run_dirs(log_dir)[0])
    assert outcome["oom"]["tried_micro_batch_sizes"] == [64, 32]
    sizes = (outcome["micro_batch_size"], outcome["accumulate_grad_batches"], outcome["effective_batch_size"])
    assert sizes == (32, 2, 128)
    assert outcome["world"]["optimizer_steps_per_rank"] == [8, 8]  # both ranks trained, in step


def test_a_nan_loss_on_one_rank_is_skipped_by_every_rank(tmp_path):
    # Rank 1's loss is nan at step 3 with every gradient finite: only rank 1 sees it. Had rank 0 taken
    # the step that rank 1 dropped, their weights would differ after it.
    report = tmp_path / "weights"
    env = env_for(tmp_path / "logs", LITLAB_TEST_NAN_AT="1:3", LITLAB_TEST_REPORT=str(report))
    nan = ["model._target_=tests.faults.ClassifierWithANanLossOnOneRank", "on_nonfinite=skip"]
    tiny = [t for t in TINY if not t.startswith("trainer.limit_train_batches")]
    ok(litlab("litlab-train", *TWO_RANKS, *nan, *tiny, "trainer.limit_train_batches=6", env=env))
    (run,) = run_dirs(tmp_path / "logs")
    assert summary(run)["nonfinite"]["skipped_at_steps"] == [3]
    rank_0, rank_1 = (torch.load(f"{report}.rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank_0.keys() == rank_1.keys() and all(torch.equal(rank_0[k], rank_1[k]) for k in rank_0)
