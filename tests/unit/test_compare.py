"""``litlab-compare`` on run directories laid out as sweeps write them (summary.json, .hydra/).

The summaries here are written by the test with chosen throughputs and memory peaks, so each
expected ratio is computed from the inputs; tests/test_sweeps.py compares real sweeps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from litlab.cli.compare import main as compare_main
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.report.render import report_runs


def write_job(
    sweep_dir: Path,
    job: int,
    *,
    precision: str = "fp32",
    accumulation: int = 1,
    devices: int = 1,
    model: str = "cnn",
    samples_per_second: float = 1000.0,
    peak_mib: float = 500.0,
    val_acc: float = 0.9,
    extra_overrides: tuple[str, ...] = (),
    status: str = "completed",
    write_summary: bool = True,
    measured: bool | None = None,
) -> dict:
    """One job directory of a sweep: .hydra/ as Hydra writes it and (unless not) a summary.json."""
    job_dir = sweep_dir / str(job)
    overrides = [
        f"precision={precision}",
        f"trainer.accumulate_grad_batches={accumulation}",
        f"trainer.devices={devices}",
        *extra_overrides,
    ]
    values = {"precision": {"value": {"fp32": "32-true", "bf16": "bf16-mixed"}[precision]}}
    config = {
        "optimized_metric": "val/acc",
        "trainer": {"accumulate_grad_batches": accumulation, "devices": devices, "num_nodes": 1},
        "data": {"batch_size": 32},
        "global_batch_size": None,
        **values,
    }
    measured = status == "completed" if measured is None else measured  # a failed run may have figures
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), job_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    choices = {"precision": precision, "model": model}
    OmegaConf.save(
        OmegaConf.create({"hydra": {"runtime": {"choices": choices}}}), job_dir / ".hydra" / "hydra.yaml"
    )
    summary = {
        "status": status,
        "error": None if status == "completed" else "RuntimeError: CUDA out of memory",
        "groups": choices,
        "overrides": overrides,
        "precision": {"requested": values["precision"]["value"], "effective": values["precision"]["value"]},
        "devices": devices,
        "num_nodes": 1,
        "micro_batch_size": 32,
        "accumulate_grad_batches": accumulation,
        "effective_batch_size": 32 * devices * accumulation,
        "metrics": {"val/acc": val_acc, "test/acc": val_acc - 0.01} if measured else {},
        "throughput": {"samples_per_second": samples_per_second} if measured else {},
        "memory": {"kind": "cpu_rss", "peak_rss_mib_per_rank": [peak_mib] * devices, "peak_mib": peak_mib}
        if measured
        else None,
    }
    if write_summary:
        (job_dir / "summary.json").write_text(json.dumps(summary))
    return summary


def grid(sweep_dir: Path) -> list[dict]:
    """devices {1, 2} x (fp32 acc 1, bf16 acc 1, fp32 acc 2), each with its own numbers."""
    jobs = []
    for devices in (1, 2):
        for precision, accumulation in (("fp32", 1), ("bf16", 1), ("fp32", 2)):
            job = len(jobs)
            jobs.append(
                write_job(
                    sweep_dir,
                    job,
                    precision=precision,
                    accumulation=accumulation,
                    devices=devices,
                    samples_per_second=900.0 + 137.0 * job,
                    peak_mib=400.0 + 31.0 * job,
                    val_acc=0.8 + 0.01 * job,
                )
            )
    return jobs


def test_each_device_count_is_compared_with_its_own_fp32_accumulation_1_run(tmp_path):
    jobs = grid(tmp_path)
    report = build_report(collect_runs([tmp_path]))
    for row, job in zip(report.rows, jobs, strict=True):
        base_index = 0 if job["devices"] == 1 else 3
        base = jobs[base_index]
        assert row["baseline"] == f"#{base_index}"
        assert row["is_baseline"] == (job is base)
        speed_up = job["throughput"]["samples_per_second"] / base["throughput"]["samples_per_second"]
        assert row["speed_up"] == pytest.approx(speed_up)
        assert row["memory_ratio"] == pytest.approx(job["memory"]["peak_mib"] / base["memory"]["peak_mib"])
        assert row["metric_delta"] == pytest.approx(job["metrics"]["val/acc"] - base["metrics"]["val/acc"])


def test_a_baseline_naming_devices_compares_every_device_count_with_that_run(tmp_path):
    jobs = grid(tmp_path)
    report = build_report(
        collect_runs([tmp_path]), baseline="precision=fp32 accumulate_grad_batches=1 trainer.devices=1"
    )
    assert {row["baseline"] for row in report.rows} == {"#0"}
    two_device_fp32 = report.rows[3]
    speed_up = jobs[3]["throughput"]["samples_per_second"] / jobs[0]["throughput"]["samples_per_second"]
    assert two_device_fp32["speed_up"] == pytest.approx(speed_up)


def test_runs_that_differ_in_another_setting_get_their_own_baseline(tmp_path):
    for job, (model, precision) in enumerate(
        [("mlp", "fp32"), ("mlp", "bf16"), ("cnn", "fp32"), ("cnn", "bf16")]
    ):
        write_job(tmp_path, job, precision=precision, model=model, extra_overrides=(f"model={model}",))
    report = build_report(collect_runs([tmp_path]))
    assert [row["baseline"] for row in report.rows] == ["#0", "#0", "#2", "#2"]
    assert [row["differs"] for row in report.rows] == [{"model": m} for m in ("mlp", "mlp", "cnn", "cnn")]
    assert report.context_keys == ["model"]


def test_failed_and_unfinished_jobs_are_rows_with_their_error(tmp_path):
    write_job(tmp_path, 0)
    failed = write_job(tmp_path, 1, precision="bf16", status="failed")
    write_job(tmp_path, 2, precision="bf16", accumulation=2, write_summary=False)  # killed mid-run
    report = report_runs([tmp_path], tmp_path)
    statuses = [(row["status"], row["error"]) for row in report.rows]
    assert statuses[0] == ("completed", None)
    assert statuses[1] == ("failed", failed["error"])
    assert statuses[2][0] == "failed" and "no summary.json" in statuses[2][1]
    assert (report.rows[2]["precision"], report.rows[2]["accumulate_grad_batches"]) == ("bf16", 2)
    assert len([r for r in report.rows if r["status"] == "failed"]) == 2
    markdown = (tmp_path / "report.md").read_text()
    assert failed["error"] in markdown and "no summary.json" in markdown
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_no_ratio_is_computed_from_or_against_a_failed_run_even_one_with_figures(tmp_path):
    # A run that trained, then failed (e.g. its world was not the configured one), has throughput,
    # memory and metrics in its summary: none of them may become a speed-up, a ratio or a delta.
    write_job(tmp_path, 0, status="failed", measured=True, samples_per_second=5000.0, peak_mib=100.0)
    base = write_job(tmp_path, 1, samples_per_second=1000.0, peak_mib=400.0)
    other = write_job(tmp_path, 2, precision="bf16", samples_per_second=1500.0, peak_mib=300.0)
    write_job(tmp_path, 3, precision="bf16", status="failed", measured=True, samples_per_second=9000.0)
    report = build_report(collect_runs([tmp_path]))
    failed_first, baseline, completed, failed_last = report.rows
    assert baseline["is_baseline"] and not failed_first["is_baseline"]
    assert completed["baseline"] == "#1" and completed["speed_up"] == pytest.approx(1.5)
    assert completed["memory_ratio"] == pytest.approx(300.0 / base["memory"]["peak_mib"])
    for row in (failed_first, failed_last):
        assert row["status"] == "failed"
        assert (row["speed_up"], row["memory_ratio"], row["metric_delta"]) == (None, None, None)
    assert other["status"] == "completed"


def test_compare_cli_writes_the_report_of_a_sweep_and_of_run_directories(tmp_path):
    grid(tmp_path / "sweep")
    compare_main([str(tmp_path / "sweep")])
    assert all((tmp_path / "sweep" / name).is_file() for name in ("report.md", "report.csv", "report.png"))
    # Two run directories (not a sweep): compared with each other into --out.
    runs = [str(tmp_path / "sweep" / "0"), str(tmp_path / "sweep" / "4")]
    compare_main([*runs, "--out", str(tmp_path / "out")])
    assert "| 0 |" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(
    "args,words",
    [
        (["{tmp}/missing"], ["missing", "not a directory"]),
        (["{tmp}"], ["neither a run directory", "sweep directory"]),
        (["{tmp}/sweep", "--baseline", "precision"], ["'precision'", "key=value"]),
        (["{tmp}/sweep", "{tmp}/sweep"], ["--out"]),
        (["{tmp}/sweep", "--metric", "val/acuracy"], ["--metric val/acuracy: no run logged it", "val/acc"]),
    ],
    ids=["missing path", "no runs", "bad baseline", "several dirs without --out", "metric not logged"],
)
def test_compare_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, words, capsys):
    write_job(tmp_path / "sweep", 0)
    with pytest.raises(SystemExit) as exit:
        compare_main([a.format(tmp=tmp_path) for a in args])
    assert exit.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("litlab: error:"), lines
    assert all(word in lines[0] for word in words), lines[0]
    assert not (tmp_path / "report.md").exists()


def test_runs_of_a_module_that_logs_no_metric_report_without_a_metric_column(tmp_path):
    """Issue 40: ``optimized_metric=null`` with Lightning's BoringModel, which logs nothing: the report
    had an empty val/acc column in report.csv, and report.png annotated and plotted val/acc."""
    for job, precision in enumerate(("fp32", "bf16")):
        write_job(tmp_path / "sweep", job, precision=precision, samples_per_second=900.0 + 100 * job)
        job_dir = tmp_path / "sweep" / str(job)
        config = OmegaConf.load(job_dir / ".hydra" / "config.yaml")
        config.optimized_metric = None
        OmegaConf.save(config, job_dir / ".hydra" / "config.yaml")
        summary = json.loads((job_dir / "summary.json").read_text())
        (job_dir / "summary.json").write_text(json.dumps({**summary, "metrics": {}}))
    report = report_runs([tmp_path / "sweep"], tmp_path / "out")
    assert report.metric is None and [row["speed_up"] for row in report.rows] == [1.0, 1000.0 / 900.0]
    header = (tmp_path / "out" / "report.csv").read_text().splitlines()[0].split(",")
    assert "speed_up" in header and not any(
        k in name for name in header for k in ("/acc", "None", "metric")
    ), header
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "val/acc" not in markdown and "None" not in markdown


def test_report_csv_keeps_its_columns_in_their_order(tmp_path):
    """report.csv's columns are a row's fields in the order compare.py builds them: a spreadsheet or
    script that reads them by position must not see them move."""
    for job, precision in enumerate(("fp32", "bf16")):
        write_job(tmp_path / "sweep", job, precision=precision, samples_per_second=900.0 + 100 * job)
    report_runs([tmp_path / "sweep"], tmp_path / "out")
    header = (tmp_path / "out" / "report.csv").read_text().splitlines()[0]
    assert header == (
        "run,status,differs,n,seeds,precision,precision_requested,precision_effective,"
        "accumulate_grad_batches,devices,num_nodes,micro_batch_size,effective_batch_size,"
        "samples_per_second,samples_per_second_ci95_low,samples_per_second_ci95_high,"
        "tokens_per_second,tokens_per_second_ci95_low,tokens_per_second_ci95_high,"
        "timings,timed_by,seconds_per_epoch,memory_kind,peak_memory_mib,"
        "peak_memory_mib_ci95_low,peak_memory_mib_ci95_high,val/acc,val/acc_ci95_low,"
        "val/acc_ci95_high,test/acc,speed_up,speed_up_p_value,speed_up_significant,"
        "timed_apart,memory_ratio,delta_val/acc,delta_val/acc_p_value,delta_val/acc_significant,"
        "seconds_to_baseline_val/acc,baseline,is_baseline,pruned_epoch,shared_node,"
        "resumed_across,diagnosis,error,run_dir"
    )
