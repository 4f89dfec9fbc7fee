"""Repeats in the sweep report: runs that differ only in their seed are one row with n, the mean and
95 % confidence interval of samples/s, peak memory and the metric, and Welch's t-test of speed-up and
Δ metric against the baseline; pruned Optuna trials and jobs that shared the node are rows of their own
kind.

The summaries are written by the test (as tests/unit/test_compare.py does) with chosen figures, and
every expected statistic is worked out here from closed forms: the t quantile of 2 and 1 degrees of
freedom, Student's t distribution function of 4 degrees of freedom, and Welch's statistic with its
Welch-Satterthwaite degrees of freedom (there only scipy's t distribution is used, not its test).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from matplotlib.container import ErrorbarContainer
from omegaconf import OmegaConf

from litlab.cli.compare import main as compare_main
from litlab.report.callback import SweepReport
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.report.render import plot, report_runs

# Per precision, per seed 1, 2, 3: samples/s, peak memory (MiB), val/acc.
FIGURES = {
    "fp32": {"samples_per_second": [1000.0, 1010.0, 990.0], "peak_mib": [500.0, 502.0, 504.0]},
    "bf16": {"samples_per_second": [1500.0, 1530.0, 1470.0], "peak_mib": [400.0, 401.0, 402.0]},
}
ACCURACY = {"fp32": [0.90, 0.91, 0.92], "bf16": [0.905, 0.915, 0.925]}
SEEDS = (1, 2, 3)


def write_job(
    sweep_dir: Path,
    job: int,
    *,
    seed: int | None,
    precision: str,
    samples_per_second: float | None = 1000.0,
    peak_mib: float = 500.0,
    val_acc: float = 0.9,
    status: str = "completed",
    beside: list[int] | None = None,
    pruned_epoch: int | None = None,
    extra_overrides: tuple[str, ...] = (),
) -> Path:
    """A job folder as a sweep writes it: .hydra/ and a summary.json with the figures given."""
    job_dir = sweep_dir / str(job)
    (job_dir / ".hydra").mkdir(parents=True)
    overrides = [f"precision={precision}", *([f"seed={seed}"] if seed is not None else []), *extra_overrides]
    config = {
        "seed": seed if seed is not None else 42,
        "optimized_metric": "val/acc",
        "trainer": {"devices": 1},
    }
    OmegaConf.save(OmegaConf.create(config), job_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    measured = status != "failed"
    summary = {
        "status": status,
        "error": "RuntimeError: CUDA out of memory" if status == "failed" else None,
        "pruned_epoch": pruned_epoch,
        "groups": {"precision": precision, "model": "mlp"},
        "overrides": overrides,
        "optimized_metric": "val/acc",
        "optimized_metric_mode": "max",
        "precision": {"requested": precision, "effective": precision},
        "devices": 1,
        "num_nodes": 1,
        "accumulate_grad_batches": 1,
        "metrics": {"val/acc": val_acc} if measured else {},
        "throughput": {"samples_per_second": samples_per_second} if measured else {},
        "memory": {"kind": "cpu_rss", "peak_mib": peak_mib, "peak_rss_mib_per_rank": [peak_mib]}
        if measured
        else None,
        "sweep": {"dir": str(sweep_dir), "job_num": job, "devices": [str(job % 2)], "beside": beside or []},
    }
    (job_dir / "summary.json").write_text(json.dumps(summary))
    return job_dir


def seed_grid(sweep_dir: Path, seeds: tuple[int, ...] = SEEDS, first_job: int = 0) -> None:
    """``seed=1,2,3 precision=fp32,bf16`` as Hydra orders the jobs: seed 1 fp32, seed 1 bf16, ..."""
    job = first_job
    for seed in seeds:
        for precision in ("fp32", "bf16"):
            index = SEEDS.index(seed)
            write_job(
                sweep_dir,
                job,
                seed=seed,
                precision=precision,
                samples_per_second=FIGURES[precision]["samples_per_second"][index],
                peak_mib=FIGURES[precision]["peak_mib"][index],
                val_acc=ACCURACY[precision][index],
            )
            job += 1


def t_quantile_975(degrees_of_freedom: int) -> float:
    """The 97.5 % quantile of Student's t in closed form: 1 degree of freedom is Cauchy's
    tan(pi (p - 1/2)); 2 degrees have t = (2p - 1) / sqrt(2 p (1 - p))."""
    p = 0.975
    if degrees_of_freedom == 1:
        return math.tan(math.pi * (p - 0.5))
    assert degrees_of_freedom == 2
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % interval: mean -/+ t(0.975, n - 1) * s / sqrt(n)."""
    mean = statistics.fmean(values)
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def two_sided_p_4_degrees(t: float) -> float:
    """Two-sided p of Student's t with 4 degrees of freedom, from its closed-form distribution
    function F(t) = 1/2 + (3/4) x - (1/4) x^3 with x = t / sqrt(4 + t^2)."""
    x = abs(t) / math.sqrt(4 + t * t)
    return 2 * (1 - (0.5 + 0.75 * x - 0.25 * x**3))


def welch_statistic(a: list[float], b: list[float]) -> tuple[float, float]:
    """Welch's t and its Welch-Satterthwaite degrees of freedom."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df


def csv_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "report.csv").open() as file:
        return list(csv.DictReader(file))


def test_the_t_quantiles_and_distribution_used_here_are_the_textbook_ones():
    # Tables of Student's t: 12.706 (1 degree of freedom), 4.303 (2); the 4-degree function at 0.
    assert t_quantile_975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile_975(2) == pytest.approx(4.3027, abs=1e-4)
    assert two_sided_p_4_degrees(0.0) == pytest.approx(1.0)
    assert two_sided_p_4_degrees(2.776) == pytest.approx(0.05, abs=1e-4)  # t(0.975, 4) = 2.776


def test_seed_repeats_are_one_row_per_configuration_with_mean_and_95_percent_interval(tmp_path):
    seed_grid(tmp_path)
    report = build_report(collect_runs([tmp_path]))
    assert report.swept_keys == ["precision"]
    fp32, bf16 = report.rows
    assert (fp32["run"], bf16["run"]) == ("#0, #2, #4", "#1, #3, #5")
    assert (fp32["n"], fp32["seeds"], bf16["n"], bf16["seeds"]) == (3, [1, 2, 3], 3, [1, 2, 3])
    for row, precision in ((fp32, "fp32"), (bf16, "bf16")):
        for name, values in (
            ("samples_per_second", FIGURES[precision]["samples_per_second"]),
            ("peak_memory_mib", FIGURES[precision]["peak_mib"]),
            ("metric", ACCURACY[precision]),
        ):
            mean, low, high = t_interval(values)
            assert row[name] == pytest.approx(mean)
            assert (row[f"{name}_ci95_low"], row[f"{name}_ci95_high"]) == (
                pytest.approx(low),
                pytest.approx(high),
            )
    # By hand: fp32 samples/s 1000 +- 4.3027 * 10 / sqrt(3) = 1000 +- 24.84.
    assert (fp32["samples_per_second_ci95_low"], fp32["samples_per_second_ci95_high"]) == (
        pytest.approx(975.16, abs=0.01),
        pytest.approx(1024.84, abs=0.01),
    )


def test_speed_up_and_metric_delta_are_tested_against_the_baselines_runs_with_welch(tmp_path):
    seed_grid(tmp_path)
    report = report_runs([tmp_path], tmp_path)
    fp32, bf16 = report.rows
    assert fp32["is_baseline"] and bf16["baseline"] == "#0, #2, #4"
    assert bf16["speed_up"] == pytest.approx(1500.0 / 1000.0)
    assert bf16["memory_ratio"] == pytest.approx(401.0 / 502.0)
    assert bf16["metric_delta"] == pytest.approx(0.005)

    # Speed-up: t = 500 / sqrt(100/3 + 900/3) = 27.39 on 2.44 degrees of freedom.
    from scipy.stats import t as student_t  # the distribution only; the test itself is worked out here

    t, df = welch_statistic(FIGURES["bf16"]["samples_per_second"], FIGURES["fp32"]["samples_per_second"])
    assert (t, df) == (pytest.approx(27.386, abs=1e-3), pytest.approx(100 / 41, rel=1e-9))
    assert bf16["speed_up_p_value"] == pytest.approx(2 * student_t.sf(t, df), rel=1e-9)
    assert bf16["speed_up_p_value"] == pytest.approx(0.000426, abs=1e-6)
    assert bf16["speed_up_significant"] is True
    # Δ val/acc: equal spreads, so Welch's degrees of freedom are 2n - 2 = 4 and the p is closed-form.
    t, df = welch_statistic(ACCURACY["bf16"], ACCURACY["fp32"])
    assert df == pytest.approx(4.0)
    assert bf16["metric_delta_p_value"] == pytest.approx(two_sided_p_4_degrees(t), rel=1e-9)
    assert bf16["metric_delta_p_value"] == pytest.approx(0.5734, abs=1e-4)
    assert bf16["metric_delta_significant"] is False
    assert fp32["speed_up"] == 1.0 and fp32["speed_up_p_value"] is None  # the baseline is not tested

    (csv_fp32, csv_bf16) = csv_rows(tmp_path)
    assert (csv_fp32["n"], csv_fp32["seeds"]) == ("3", "1;2;3")
    assert float(csv_bf16["speed_up_p_value"]) == pytest.approx(bf16["speed_up_p_value"])
    assert (csv_bf16["speed_up_significant"], csv_bf16["delta_val/acc_significant"]) == ("True", "False")
    assert float(csv_bf16["delta_val/acc_p_value"]) == pytest.approx(bf16["metric_delta_p_value"])
    for name in ("samples_per_second", "peak_memory_mib", "val/acc"):
        low, high = float(csv_bf16[f"{name}_ci95_low"]), float(csv_bf16[f"{name}_ci95_high"])
        assert low < float(csv_bf16[name]) < high

    markdown = (tmp_path / "report.md").read_text()
    assert "6 runs (6 completed, 0 failed) in 2 rows" in markdown
    (words,) = [line for line in markdown.splitlines() if line.startswith("- bf16")]
    assert "speed-up 1.50x exceeds run-to-run noise (Welch's t-test p = 0.00043 < 0.05)" in words
    assert "Δ val/acc +0.0050 is within run-to-run noise (Welch's t-test p = 0.57 ≥ 0.05)" in words
    assert "| 1000.0 ± 24.8 |" in markdown  # fp32 samples/s: the mean and the half-width


def test_a_configuration_that_lost_a_seed_has_n_2_and_the_failed_run_is_a_row_of_its_own(tmp_path):
    seed_grid(tmp_path, seeds=(1, 2))
    write_job(tmp_path, 4, seed=3, precision="fp32", samples_per_second=990.0, peak_mib=504.0, val_acc=0.92)
    write_job(tmp_path, 5, seed=3, precision="bf16", status="failed")
    report = build_report(collect_runs([tmp_path]))
    fp32, bf16, failed = report.rows
    assert (fp32["n"], bf16["n"], failed["n"], failed["status"]) == (3, 2, 1, "failed")
    mean, low, high = t_interval([1500.0, 1530.0])  # 1 degree of freedom: t = 12.706
    assert (bf16["samples_per_second"], bf16["samples_per_second_ci95_low"]) == (mean, pytest.approx(low))
    assert bf16["samples_per_second_ci95_high"] == pytest.approx(high)
    assert failed["speed_up"] is None
    assert [row["run"] for row in report.rows if row["status"] == "failed"] == ["#5"]


def test_one_run_per_configuration_has_no_interval_and_says_so_in_one_line(tmp_path):
    write_job(tmp_path, 0, seed=None, precision="fp32", samples_per_second=1000.0)
    write_job(tmp_path, 1, seed=None, precision="bf16", samples_per_second=1170.0)
    report = report_runs([tmp_path], tmp_path)
    bf16 = report.rows[1]
    assert bf16["n"] == 1 and bf16["speed_up"] == pytest.approx(1.17)
    assert bf16["samples_per_second_ci95_low"] is None and bf16["speed_up_p_value"] is None
    assert bf16["speed_up_significant"] is None
    csv_bf16 = csv_rows(tmp_path)[1]
    assert (csv_bf16["samples_per_second_ci95_low"], csv_bf16["speed_up_p_value"]) == ("", "")
    lines = (tmp_path / "report.md").read_text().splitlines()
    (line,) = [line for line in lines if line.startswith("n = 1")]
    assert "no row has a confidence interval" in line and "run-to-run noise" in line and "seed=1,2,3" in line
    assert "## Against run-to-run noise" not in lines


def test_a_pruned_trial_is_a_pruned_row_with_its_epoch_not_a_failure(tmp_path):
    lr = ("optimizer.lr=0.1", "optimizer.lr=0.00001", "optimizer.lr=0.01")
    write_job(tmp_path, 0, seed=None, precision="fp32", extra_overrides=(lr[0],))
    write_job(
        tmp_path, 1, seed=None, precision="fp32", status="pruned", pruned_epoch=2, extra_overrides=(lr[1],)
    )
    write_job(tmp_path, 2, seed=None, precision="fp32", extra_overrides=(lr[2],))
    config = OmegaConf.create({"task_name": "train", "hydra": {"sweep": {"dir": str(tmp_path)}}})
    SweepReport().on_multirun_end(config)  # the multirun's end: no SystemExit, as with no failure
    rows = csv_rows(tmp_path)
    assert [(row["status"], row["pruned_epoch"]) for row in rows] == [
        ("completed", ""),
        ("pruned", "2"),
        ("completed", ""),
    ]
    markdown = (tmp_path / "report.md").read_text()
    assert "3 runs (2 completed, 1 pruned, 0 failed)" in markdown
    assert "| pruned (epoch 2) |" in markdown and "## Failed runs" not in markdown
    report = build_report(collect_runs([tmp_path]))
    assert [row for row in report.rows if row["status"] == "failed"] == []
    assert [row["run"] for row in report.rows if row["status"] == "pruned"] == ["#1"]

    write_job(tmp_path, 3, seed=None, precision="fp32", status="failed", extra_overrides=("optimizer.lr=1",))
    with pytest.raises(SystemExit) as exit:  # a failure still makes the multirun exit non-zero
        SweepReport().on_multirun_end(config)
    assert exit.value.code == 1


def test_rows_whose_jobs_shared_the_node_are_marked_with_one_line_on_solo_timings(tmp_path):
    for job, (seed, precision) in enumerate([(1, "fp32"), (1, "bf16"), (2, "fp32"), (2, "bf16")]):
        write_job(tmp_path, job, seed=seed, precision=precision, beside=[job ^ 1])
    write_job(tmp_path, 4, seed=None, precision="fp16", extra_overrides=("trainer.max_epochs=2",))
    report_runs([tmp_path], tmp_path)
    rows = csv_rows(tmp_path)
    assert [(row["run"], row["shared_node"]) for row in rows] == [
        ("#0, #2", "True"),
        ("#1, #3", "True"),
        ("#4", "False"),
    ]
    markdown = (tmp_path / "report.md").read_text()
    (line,) = [line for line in markdown.splitlines() if "solo timing" in line]
    assert "#0, #2" in line and "#4" not in line and "`hydra.launcher.devices=1 resume=never`" in line
    assert sum("| completed † |" in row for row in markdown.splitlines()) == 2


def test_a_row_with_solo_timings_combines_only_those_and_is_not_marked(tmp_path):
    """The same seeds timed beside other jobs, then alone (``resume=never hydra.launcher.devices=1``):
    the row's throughput is the solo timings', never a mean of both kinds."""
    write_job(tmp_path, 0, seed=1, precision="fp32", samples_per_second=500.0, beside=[1])
    write_job(tmp_path, 1, seed=2, precision="fp32", samples_per_second=520.0, beside=[0])
    write_job(tmp_path, 2, seed=3, precision="fp32", samples_per_second=1000.0)
    write_job(tmp_path, 3, seed=4, precision="fp32", samples_per_second=1010.0)
    (row,) = build_report(collect_runs([tmp_path])).rows
    assert (row["n"], row["timings"], row["shared_node"]) == (4, 2, False)
    assert row["samples_per_second_values"] == [1000.0, 1010.0]


def test_litlab_compare_groups_seeds_gathered_from_several_sweeps(tmp_path):
    """litlab-compare MONDAY TUESDAY --out OUT: the seeds of both sweeps are one row per configuration."""
    seed_grid(tmp_path / "monday", seeds=(1, 2))
    seed_grid(tmp_path / "tuesday", seeds=(3,))
    seed_grid(tmp_path / "together")
    compare_main([str(tmp_path / "monday"), str(tmp_path / "tuesday"), "--out", str(tmp_path / "out")])
    compare_main([str(tmp_path / "together")])
    gathered, together = csv_rows(tmp_path / "out"), csv_rows(tmp_path / "together")
    assert [row["run"] for row in gathered] == [
        "monday/0, monday/2, tuesday/0",
        "monday/1, monday/3, tuesday/1",
    ]
    assert [row["n"] for row in gathered] == ["3", "3"]
    for row, same in zip(gathered, together, strict=True):
        for name in ("samples_per_second_ci95_low", "val/acc_ci95_high", "speed_up_p_value", "delta_val/acc"):
            assert float(row[name] or "nan") == pytest.approx(float(same[name] or "nan"), nan_ok=True)
    assert float(gathered[1]["speed_up_p_value"]) == pytest.approx(0.000426, abs=1e-6)


def test_report_png_draws_each_rows_interval_as_its_error_bar(tmp_path):
    seed_grid(tmp_path)
    report = build_report(collect_runs([tmp_path]))
    figure = plot(report)
    throughput_axis = figure.subfigs[0].axes[0]
    (bars,) = [c for c in throughput_axis.containers if isinstance(c, ErrorbarContainer)]
    (_, _, (vertical,)) = bars.lines
    ends = [sorted(segment[:, 1]) for segment in vertical.get_segments()]
    expected = [
        [row["samples_per_second_ci95_low"], row["samples_per_second_ci95_high"]] for row in report.rows
    ]
    assert ends == [[pytest.approx(low), pytest.approx(high)] for low, high in expected]


def test_a_sweep_with_nothing_left_to_run_ends_without_a_report_and_without_failing(tmp_path, caplog):
    # The same search command run again once its study has n_trials: the sweeper starts no job.
    (tmp_path / "multirun.yaml").write_text("{}\n")
    config = OmegaConf.create({"task_name": "train", "hydra": {"sweep": {"dir": str(tmp_path)}}})
    with caplog.at_level("INFO"):
        SweepReport().on_multirun_end(config)  # no SystemExit
    assert not (tmp_path / "report.md").exists()
    assert any("no job ran" in record.getMessage() for record in caplog.records)
