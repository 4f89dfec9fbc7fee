"""The run doctor on real runs: what it finds in runs that really overfit, underfit, are input-bound
or unstable, and that it finds nothing in a healthy default run. The runs are those `litlab-train`
makes for the commands of docs/troubleshooting.md, in-process on one device.

Each run is a real Trainer on the digits; the findings come from the run's own summary.json.
"""

from __future__ import annotations

import logging

import pytest
import torch

from litlab.callbacks.run_stats import count_spikes
from litlab.run import doctor
from litlab.run.summary import Summary
from tests.conftest import logged, train_in_process

# No logger, checkpoints or test: the findings need only the training and its validation.
QUIET = [
    "logger=none",
    "callbacks=none",
    "test_after_fit=false",
    "trainer.enable_model_summary=false",
    "trainer.num_sanity_val_steps=0",
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Steps on one thread: on a busy 2-core machine torch's second thread can make a 5 ms step take
    150 ms (measured), which would hide a slow loader's wait behind the step, and slow every run here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def symptoms(summary: dict) -> list[str]:
    return [finding["symptom"] for finding in summary["diagnosis"]]


def test_a_healthy_default_run_has_no_finding_and_a_full_history(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="litlab"):
        summary = train_in_process(tmp_path)  # the default: CNN on the digits, 10 epochs
    assert summary["status"] == "completed" and summary["diagnosis"] == []
    assert not [r for r in caplog.records if r.getMessage().startswith("doctor:")]
    history = summary["history"]
    assert [entry["epoch"] for entry in history] == list(range(10))
    # 1259 training samples: 19 whole batches of 64 an epoch (docs/sweeps.md)
    assert [entry["step"] for entry in history] == [19 * (epoch + 1) for epoch in range(10)]
    train_samples = history[0]["samples"]
    assert [entry["samples"] for entry in history] == [train_samples * (e + 1) for e in range(10)]
    seconds = [entry["wall_s"] for entry in history]
    assert seconds == sorted(seconds) and seconds[0] > 0
    # The monitored metric per epoch ends where the summary's final value is.
    assert history[-1]["metrics"]["val/acc"] == summary["metrics"]["val/acc"]
    assert history[-1]["train_loss"] < history[0]["train_loss"] < history[0]["train_loss_start"]
    assert summary["input_wait"]["share"] < doctor.INPUT_BOUND_SHARE


def test_a_large_net_on_a_tiny_train_split_is_found_overfitting(tmp_path):
    summary = train_in_process(
        tmp_path,
        *QUIET,
        "model=mlp",
        "model.net.hidden_sizes=[512,512]",
        "model.net.dropout=0",
        "data.val_fraction=0.5",  # 10% of the digits to train on
        "data.test_fraction=0.4",
        "data.batch_size=32",
        "optimizer.lr=0.01",
        "trainer.max_epochs=10",
        "optimized_metric=val/loss",
        "optimized_metric_mode=min",
    )
    assert symptoms(summary) == ["overfitting"]
    (line,) = logged(tmp_path / "run", "doctor:")
    assert line.startswith("doctor: overfitting: val/loss was best at epoch") and "early_stopping" in line
    losses = [entry["metrics"]["val/loss"] for entry in summary["history"]]
    assert losses[-1] > min(losses)  # what the finding says holds in the run's own numbers


def test_a_learning_rate_of_1e_7_is_found_underfitting(tmp_path):
    summary = train_in_process(tmp_path, *QUIET, "model=mlp", "optimizer.lr=1e-7", "trainer.max_epochs=4")
    assert symptoms(summary) == ["underfitting"]
    assert "optimizer.lr" in summary["diagnosis"][0]["cures"]


def test_a_slow_train_loader_is_found_input_bound(tmp_path):
    # docs/troubleshooting.md runs it as `python -m litlab.cli.train` from the repository's root,
    # where Python imports tests.faults; here the same overrides train in-process.
    summary = train_in_process(
        tmp_path,
        *QUIET,
        "model=mlp",
        "data._target_=tests.faults.DigitsServedSlowly",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=14",  # 11 measured after the first 3
        "trainer.limit_val_batches=1",
    )
    assert symptoms(summary) == ["input-bound"]
    wait = summary["input_wait"]
    assert wait["share"] >= doctor.INPUT_BOUND_SHARE and wait["batches"] >= doctor.MIN_MEASURED_BATCHES
    # The loader sleeps 100 ms before every batch: the measured wait is at least that.
    assert wait["wait_s"] >= 0.1 * wait["batches"]


def test_skipped_non_finite_steps_are_found_unstable(tmp_path):
    summary = train_in_process(
        tmp_path,
        *QUIET,
        "model=mlp",
        "optimizer=sgd",
        "optimizer.lr=1e9",  # the loss turns inf/nan within a few steps
        "optimizer.weight_decay=0",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=4",
        "on_nonfinite=skip",
    )
    assert summary["nonfinite"]["skipped_steps"] >= 1
    assert "instability" in symptoms(summary)


def test_a_spike_is_a_step_that_gives_back_half_of_the_progress():
    falling = [2.3 * 0.97**i for i in range(60)]  # a healthy curve, noisy at the end
    noisy = falling + [falling[-1] * f for f in (1.8, 0.7, 1.9, 0.8)]
    assert count_spikes(noisy, [], start_loss=2.3) == 0
    assert count_spikes(falling + [2.0, falling[-1]], [], start_loss=2.3) == 1
    # Judged against the steps before it, across epochs: the window is carried over.
    recent: list[float] = []
    count_spikes(falling, recent, start_loss=2.3)
    assert count_spikes([2.0], recent, start_loss=2.3) == 1


def test_a_cuda_micro_batch_that_uses_a_sliver_of_the_device_is_named():
    def on_device(peak_mib: float, micro: int | None = 32) -> Summary:
        memory = {"kind": "cuda", "max_allocated_mib_per_rank": [peak_mib], "peak_mib": peak_mib}
        return Summary(status="completed", micro_batch_size=micro, memory=memory, device_memory_mib=80_000.0)

    (finding,) = doctor.diagnose(on_device(2_000.0))
    assert finding["symptom"] == "small micro-batch" and "tune.batch_size=true" in finding["cures"]
    assert "2000 MiB of the device's 80000 MiB (2%)" in finding["evidence"]
    assert doctor.diagnose(on_device(40_000.0)) == []
    assert doctor.diagnose(on_device(2_000.0, micro=None)) == []  # no data.batch_size to raise
    cpu = Summary(status="completed", memory={"kind": "cpu_rss", "peak_mib": 100.0}, device_memory_mib=None)
    assert doctor.diagnose(cpu) == []
