"""Learning curves and time-to-target: the per-epoch history in summary.json, and what the report
draws and computes from it.

The report tests write summaries with chosen histories (as tests/unit/test_compare.py does), so every
expected number follows from the inputs; the history tests train real runs in-process.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.report.render import plot, report_runs
from tests.conftest import TINY, train_in_process


def write_run(
    sweep: Path,
    job: int,
    precision: str,
    curve: list[tuple[float, int, float]],
    mode: str = "max",
    diagnosis: list[dict] | None = None,
) -> Path:
    """A job folder holding only summary.json (as copied from another machine), its history made of
    (wall seconds, samples, metric) per epoch; the final metric is the last epoch's."""
    run_dir = sweep / str(job)
    run_dir.mkdir(parents=True)
    history = [
        {"epoch": i, "wall_s": seconds, "samples": samples, "train_loss": 1.0, "metrics": {"val/loss": value}}
        for i, (seconds, samples, value) in enumerate(curve)
    ]
    summary = {
        "status": "completed",
        "groups": {"precision": precision},
        "overrides": [f"precision={precision}", "trainer.accumulate_grad_batches=1"],
        "optimized_metric": "val/loss",
        "optimized_metric_mode": mode,
        "precision": {"requested": precision, "effective": precision},
        "devices": 1,
        "num_nodes": 1,
        "accumulate_grad_batches": 1,
        "metrics": {"val/loss": curve[-1][2]},
        "throughput": {"samples_per_second": 100.0},
        "history": history,
        "diagnosis": diagnosis or [],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_seconds_until_each_run_first_reached_the_baselines_final_metric(tmp_path):
    sweep = tmp_path / "sweep"
    # A loss (mode min): the fp32 baseline ends at 0.5; bf16 gets there at 6 s, fp16 never does.
    write_run(sweep, 0, "fp32", [(4.0, 100, 0.9), (8.0, 200, 0.6), (12.0, 300, 0.5)], mode="min")
    write_run(sweep, 1, "bf16", [(3.0, 100, 0.7), (6.0, 200, 0.45), (9.0, 300, 0.52)], mode="min")
    write_run(sweep, 2, "fp16", [(3.0, 100, 0.8), (6.0, 200, 0.6), (9.0, 300, 0.55)], mode="min")
    report = report_runs([sweep], sweep)
    seconds = {row["run"]: row["seconds_to_baseline"] for row in report.rows}
    assert seconds == {"#0": 12.0, "#1": 6.0, "#2": "never"}
    table = (sweep / "report.md").read_text()
    assert "s to baseline's val/loss" in table and "| never |" in table
    with (sweep / "report.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["seconds_to_baseline_val/loss"] for row in rows] == ["12.0", "6.0", "never"]


def test_the_direction_is_the_runs_optimized_metric_mode_not_the_metrics_name(tmp_path):
    # The same numbers with mode max: higher is better, so the baseline's 0.5 is reached at once.
    sweep = tmp_path / "sweep"
    write_run(sweep, 0, "fp32", [(4.0, 100, 0.9), (8.0, 200, 0.6), (12.0, 300, 0.5)], mode="max")
    write_run(sweep, 1, "bf16", [(3.0, 100, 0.4), (6.0, 200, 0.45), (9.0, 300, 0.52)], mode="max")
    report = build_report(collect_runs([sweep]))
    assert [row["seconds_to_baseline"] for row in report.rows] == [4.0, 9.0]


def test_report_png_has_the_metric_against_seconds_and_samples_one_line_per_run(tmp_path):
    sweep = tmp_path / "sweep"
    curves = {
        "fp32": [(4.0, 100, 0.9), (8.0, 200, 0.6)],
        "bf16": [(3.0, 100, 0.8), (6.0, 200, 0.5), (9.0, 300, 0.4)],
    }
    for job, (precision, curve) in enumerate(curves.items()):
        write_run(sweep, job, precision, curve, mode="min")
    figure = plot(build_report(collect_runs([sweep])))
    axes = {axis.get_xlabel(): axis for axis in figure.axes}
    by_time = axes["wall-clock seconds of training"]
    by_samples = axes["training samples seen (all ranks)"]
    assert by_time.get_ylabel() == "val/loss"
    for axis, column in ((by_time, 0), (by_samples, 1)):
        drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()]
        expected = [([p[column] for p in curve], [p[2] for p in curve]) for curve in curves.values()]
        assert drawn == expected
    assert [text.get_text() for text in by_time.get_legend().get_texts()] == ["fp32", "bf16"]


def test_the_doctors_findings_are_in_the_report(tmp_path):
    sweep = tmp_path / "sweep"
    finding = {
        "symptom": "input-bound",
        "evidence": "80% of the training time went to waiting",
        "cures": "workers",
    }
    write_run(sweep, 0, "fp32", [(1.0, 10, 0.5)])
    write_run(sweep, 1, "bf16", [(1.0, 10, 0.5)], diagnosis=[finding])
    report_runs([sweep], sweep)
    table = (sweep / "report.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    assert header.endswith("| doctor |")
    assert "- #1: **input-bound**: 80% of the training time went to waiting. Cures: workers" in table
    with (sweep / "report.csv").open() as file:
        assert [row["diagnosis"] for row in csv.DictReader(file)] == ["", "input-bound"]


def test_testing_an_earlier_best_checkpoint_keeps_the_whole_history(tmp_path):
    # mode=min on an accuracy that rises: the best checkpoint, which trainer.test restores, is epoch 0's.
    overrides = ["model=mlp", "optimized_metric_mode=min", "trainer.max_epochs=3", *TINY[1:]]
    summary = train_in_process(tmp_path, *overrides)
    assert summary["checkpoints"]["tested"].endswith("epoch_000-step_000004.ckpt")
    assert [entry["epoch"] for entry in summary["history"]] == [0, 1, 2]


def test_a_resumed_run_continues_its_history(tmp_path):
    tiny = [*TINY[1:], "model=mlp", "run_name=curve"]
    first = train_in_process(tmp_path, *tiny, "trainer.max_epochs=2", name="first")
    resume = f"resume={first['checkpoints']['last']}"
    resumed = train_in_process(tmp_path, *tiny, "trainer.max_epochs=4", resume, name="resumed")
    history = resumed["history"]
    assert [entry["epoch"] for entry in history] == [0, 1, 2, 3]
    assert history[:2] == first["history"]  # the first attempt's epochs as they were recorded
    samples = [entry["samples"] for entry in history]
    assert samples == [samples[0] * (epoch + 1) for epoch in range(4)]
    seconds = [entry["wall_s"] for entry in history]
    assert seconds == sorted(seconds)  # training time goes on from the first attempt's
