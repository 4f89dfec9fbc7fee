"""The pure parts of hang detection: phases in words, allowances, which rank the others wait for,
byte counting of checkpoint writes; ``-m`` anywhere; a part that refuses to build, in one line."""

from __future__ import annotations

import io
import os
import time

import pytest
import torch

from litlab.cli.preflight import multirun_flag_first
from litlab.heartbeat import (
    CHECKPOINT,
    DATA,
    STARTING,
    TRAINING,
    VALIDATION,
    CountingWriter,
    Heartbeat,
    State,
    allowance,
    describe,
    order,
)
from litlab.run.hangs import poll_interval


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (State(TRAINING, 5), "training step 5"),
        (State(DATA, 6), "waiting for data (before training step 6)"),
        (State(VALIDATION, 8), "validation at global step 8"),
        (State(CHECKPOINT, 6, bytes_written=3 * 2**20), "checkpoint write at global step 6, 3.0 MiB written"),
        (
            State(CHECKPOINT, 6, bytes_written=100, upload_bytes=100),
            "checkpoint write at global step 6, 100 bytes written, uploading 100 bytes",
        ),
        (State(STARTING, 0), "starting (before training step 0: setup, checkpoint restore, first batch)"),
    ],
)
def test_phases_are_named_as_the_stuck_ranks_line_says(state, words):
    assert describe(state) == words


def test_a_first_step_validation_or_start_and_a_large_upload_get_more_time():
    assert allowance(State(TRAINING, 7, first=False), 10) == 10
    assert allowance(State(TRAINING, 0, first=True), 10) == 30  # compiling, cudnn benchmarks
    assert allowance(State(VALIDATION, 4, first=True), 10) == 30
    assert allowance(State(STARTING, 0, first=False), 10) == 30
    upload = State(CHECKPOINT, 6, first=False, upload_bytes=100 * 2**20)  # 10 s at 10 MiB/s
    assert allowance(upload, 10) == 20


def test_the_rank_with_fewest_beats_is_the_one_the_others_wait_for():
    waiting_in_collective = State(TRAINING, 6, beats=30)
    stuck_in_step = State(TRAINING, 5, beats=27)
    assert min([waiting_in_collective, stuck_in_step], key=order) is stuck_in_step
    # A tie: the checkpoint writer is stuck, the other rank waits at the barrier after the write.
    writing, at_barrier = State(CHECKPOINT, 6, beats=20), State(TRAINING, 6, beats=20)
    assert min([at_barrier, writing], key=order) is writing


def test_checkpoint_bytes_count_as_progress_and_the_phase_is_restored_after_the_write():
    heartbeat = Heartbeat()
    heartbeat.beat(DATA, 6)
    before = heartbeat.state
    with heartbeat.writing_checkpoint(6):
        assert heartbeat.state.phase == CHECKPOINT
        at = heartbeat.at
        time.sleep(0.01)
        torch.save({"weights": torch.zeros(1000)}, CountingWriter(io.BytesIO(), heartbeat))
        assert heartbeat.state.bytes_written > 4000 and heartbeat.at > at
    assert heartbeat.state == before  # back where it was: the write is not a beat of the loop


def test_the_watchdog_looks_often_enough_for_the_shortest_limit():
    assert poll_interval(1800, 20) == 1.0
    assert poll_interval(2, 0) == 0.1
    assert poll_interval(0, 3) == pytest.approx(0.15)
    assert poll_interval(0, 0) == 1.0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["experiment=char_lm", "-m", "precision=fp32,bf16"],
            ["-m", "experiment=char_lm", "precision=fp32,bf16"],
        ),
        (["a=1", "--multirun", "b=1,2"], ["--multirun", "a=1", "b=1,2"]),
        (["-m", "a=1,2"], ["-m", "a=1,2"]),
        (["a=1"], ["a=1"]),
    ],
)
def test_multirun_flag_anywhere_goes_first(args, expected):
    assert multirun_flag_first(args) == expected


def test_a_part_that_raises_while_built_is_one_line_naming_it_and_the_librarys_reason():
    from litlab.run.build import PartRefused, refused_in_one_line

    with pytest.raises(PartRefused) as refused, refused_in_one_line("callbacks.early", "x.y.EarlyStopping"):
        raise RuntimeError("monitor\n  is required")
    assert (
        refused.value.reason
        == "callbacks.early: EarlyStopping refused to start: RuntimeError: monitor is required"
    )
    assert refused.value.exit_code == 2


def test_a_run_beats_through_its_phases_and_only_the_first_step_and_validations_get_more_time(tmp_path):
    from tests.conftest import TINY, train_in_process
    from tests.faults import PHASES_SEEN

    PHASES_SEEN.clear()
    tiny = [t for t in TINY if "max_epochs" not in t and "num_sanity" not in t and "limit_train" not in t]
    summary = train_in_process(
        tmp_path,
        "model=mlp",
        *tiny,
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "trainer.num_sanity_val_steps=1",
        "+callbacks.spy._target_=tests.faults.PhaseSpy",
        "hang_timeout=60",
    )
    assert summary["status"] == "completed"
    train = [(hook, words, first) for hook, words, first in PHASES_SEEN if hook.startswith("train")]
    assert train == [
        ("train_batch_start", "training step 0", True),
        ("train_batch_end", "training step 0", True),  # yours run before the batch's last beat
        ("train_batch_start", "training step 1", False),
        ("train_batch_end", "training step 1", False),
        ("train_batch_start", "training step 2", False),
        ("train_batch_end", "training step 2", False),
        ("train_batch_start", "training step 3", False),
        ("train_batch_end", "training step 3", False),
    ]
    validations = [(words, first) for hook, words, first in PHASES_SEEN if hook.startswith("validation")]
    sanity, first, second = validations[0], validations[1], validations[-1]
    assert sanity == ("validation at global step 0", True) and first == ("validation at global step 2", True)
    assert second == ("validation at global step 4", False)


def test_a_heartbeat_record_reads_the_facts_of_its_process_once(monkeypatch):
    from litlab import heartbeat

    first = heartbeat.record()
    monkeypatch.setattr(heartbeat.psutil, "Process", lambda *args: pytest.fail("read again at a beat"))
    again = heartbeat.record(stalled=False)
    assert again["pid"] == first["pid"] == os.getpid() and again["stalled"] is False
    assert again["process_started"] == first["process_started"] and again["host"] == first["host"]
