"""A real multirun with a seed axis: ``litlab-train sweep=precision_accumulation ... seed=1,2`` ends with
one report row per configuration, whose n, mean and 95 % interval are those of its runs' own
summary.json figures (tests/unit/test_report_repeats.py checks the statistics against known values).
"""

from __future__ import annotations

import math
import statistics

import pytest

from tests.integration.test_sweeps import SWEEP_TINY, report_rows, summaries, sweep


@pytest.mark.slow
def test_a_sweep_with_a_seed_axis_reports_one_row_per_configuration(tmp_path):
    _, sweep_dir = sweep(
        tmp_path,
        "sweep=precision_accumulation",
        "precision=fp32,bf16",
        "trainer.accumulate_grad_batches=1",
        "seed=1,2",
        *SWEEP_TINY,
    )
    runs = summaries(sweep_dir)
    assert len(runs) == 4 and {run["status"] for run in runs} == {"completed"}
    rows = report_rows(sweep_dir)
    assert sorted(row["precision"] for row in rows) == ["bf16", "fp32"]  # 4 jobs, 2 configurations
    for row in rows:
        mine = [run for run in runs if run["groups"]["precision"] == row["precision"]]
        assert (row["n"], sorted(row["seeds"].split(";"))) == ("2", ["1", "2"])
        throughput = [run["throughput"]["samples_per_second"] for run in mine]
        mean = statistics.fmean(throughput)
        assert math.isclose(float(row["samples_per_second"]), mean, rel_tol=1e-9)
        # 2 runs: 1 degree of freedom, t(0.975, 1) = tan(0.475 pi) = 12.706
        half = math.tan(0.475 * math.pi) * statistics.stdev(throughput) / math.sqrt(2)
        assert math.isclose(float(row["samples_per_second_ci95_high"]), mean + half, rel_tol=1e-9)
        metric = statistics.fmean(run["metrics"]["val/acc"] for run in mine)
        assert math.isclose(float(row["val/acc"]), metric, rel_tol=1e-9)
    (compared,) = [row for row in rows if row["is_baseline"] == "False"]
    assert compared["speed_up_p_value"] != "" and compared["speed_up_significant"] in ("True", "False")
    assert "Against run-to-run noise" in (sweep_dir / "report.md").read_text()
