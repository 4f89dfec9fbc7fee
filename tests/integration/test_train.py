"""Real training runs through ``litlab-train`` (subprocesses, tiny settings unless stated). The default
experiment's accuracy is tests/integration/test_readme.py's (``make train`` as the README types it)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from litlab import train as litlab_train
from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ok, run_dirs, summary


@pytest.mark.slow
def test_ddp_with_two_ranks_writes_one_run_directory_and_trains_compiled(log_dir):
    # One run checks both: what two ranks write, and compile=true under DDP, where Lightning calls the
    # steps through the module's forward (its forward redirection): compiling the module's call, or
    # the steps, traces the metrics' code in them.
    args = [
        "compile=true",
        "model=mlp",
        "trainer.devices=2",
        "strategy=ddp",
        *TINY[:-1],
        "logger=tensorboard",
    ]
    output = ok(litlab("litlab-train", *args)).stdout
    runs = run_dirs(log_dir)
    assert len(runs) == 1, runs
    (run,) = runs
    assert [p.name for p in (log_dir / "train" / "runs").iterdir()] == [run.name]  # one folder, no other
    # One TensorBoard log: one log directory, written by one process (rank 0) only.
    events = list(log_dir.glob("**/events.out.tfevents.*"))
    assert {e.parent for e in events} == {run / "tensorboard"}
    assert len({e.name.split(".")[4] for e in events}) == 1  # events.out.tfevents.<time>.<host>.<pid>.<n>
    assert list(log_dir.glob("**/summary.json")) == [run / "summary.json"]  # its storage is its folder
    result = summary(run)
    assert (result["status"], result["world_size"], result["devices"], result["strategy"]) == (
        "completed",
        2,
        2,
        "ddp",
    )
    assert result["global_step"] == 4 and "test/acc" in result["metrics"]
    assert len(result["memory"]["peak_rss_mib_per_rank"]) == 2
    train_log = (run / "train.log").read_text()
    assert "[rank 0]" in train_log and "[rank 1]" in train_log
    for text in (output, train_log):  # the run's result line, once, by rank 0
        (result_line,) = [line for line in text.splitlines() if line.endswith(f"; run: {run}")]
        assert "[rank 0][litlab][INFO] val/acc = " in result_line, result_line


def epoch_metrics(run: Path) -> dict[str, float]:
    """The first epoch's train/loss and train/acc from the run's CSV log."""
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    return {key: float(next(row[key] for row in rows if row.get(key))) for key in ("train/loss", "train/acc")}


@pytest.mark.slow
def test_training_epoch_metrics_count_every_rank_once(log_dir):
    # A frozen model (lr 1e-30 moves no float32 weight; no dropout) over one whole epoch whose 810
    # samples split evenly over 2 ranks: one device and 2 DDP ranks see the same samples, so the
    # epoch's loss and accuracy must agree, which they only do if every rank's sums are added up.
    frozen = [
        "model=mlp",
        "model.net.dropout=0",
        "optimizer.lr=1e-30",
        "data.test_fraction=0.4",  # 1797 - 718 test - 269 validation = 810 training samples
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
        "test_after_fit=false",
        "logger=csv",
    ]
    ok(litlab("litlab-train", *frozen, "run_name=one-device"))
    ok(litlab("litlab-train", *frozen, "trainer.devices=2", "strategy=ddp", "run_name=two-ranks"))
    one, two = (
        epoch_metrics(run) for run in sorted(run_dirs(log_dir), key=lambda r: summary(r)["world_size"])
    )
    assert 0.0 < one["train/acc"] < 1.0
    assert two["train/acc"] == one["train/acc"]
    assert two["train/loss"] == pytest.approx(one["train/loss"], rel=1e-5)


@pytest.mark.slow
def test_eval_reports_the_test_metric_training_reported(log_dir):
    # Trained in this process (litlab.train); evaluated by the command, which is the thing under test.
    trained = litlab_train(["trainer.max_epochs=1", "trainer.limit_train_batches=6", "logger=none"])
    (run,) = run_dirs(log_dir)
    # With one epoch the best checkpoint and last.ckpt hold the same weights.
    ok(litlab("litlab-eval", f"ckpt_path={run}/checkpoints/last.ckpt"))
    (evaluation,) = run_dirs(log_dir, "eval")
    metrics = json.loads((evaluation / "eval.json").read_text())["metrics"]
    assert trained["checkpoints"]["tested"] != trained["checkpoints"]["last"]
    assert abs(metrics["test/acc"] - trained["metrics"]["test/acc"]) <= 1e-6
    assert abs(metrics["test/loss"] - trained["metrics"]["test/loss"]) <= 1e-6


def nvml_installed() -> bool:
    """Whether the dynamic linker's cache lists NVIDIA's NVML library (asked of ldconfig, not in the
    way the engine probes it)."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    return "libnvidia-ml.so.1 " in listed


def test_training_runs_with_import_time_objects_frozen_and_no_per_step_nvml_probe(log_dir, tmp_path):
    # Measured reasons (README "What litlab costs"): a full garbage collection walked torch's and
    # Lightning's ~500k import-time objects (0.3 s pauses); and on machines without NVML, torch's
    # Adam re-tried loading it at every step because Lightning's import asks for NVML-based checks.
    report = tmp_path / "process.json"
    env = {**FAULTS_IMPORTABLE, "LITLAB_TEST_REPORT": str(report)}
    ok(
        litlab(
            "litlab-train",
            "model=mlp",
            "model.net._target_=tests.faults.MLPReportingItsProcess",
            *TINY,
            env=env,
            cold=True,  # what Lightning's import does to the process: a warm start imported it earlier
        )
    )
    state = json.loads(report.read_text())
    assert state["frozen_objects"] > 100_000
    assert state["nvml_based_cuda_check"] == ("1" if nvml_installed() else None)
