"""A sweep report that cannot lie: every row is the runs the sweep's own record holds, each run counted
once, grouped by what really ran (settings, code version, devices x nodes), with every status said as
it is.

The sweeps here are their records alone (``.jobs/<n>.json`` and ``.jobs/sweep.json``, as
``litlab.run.sweep_record`` writes them), written by the test with chosen figures; every expected
number is computed from those inputs.
"""

from __future__ import annotations

import atexit
import csv
import hashlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from omegaconf import OmegaConf
from scipy import stats

from litlab.cli.compare import main as compare_main
from litlab.report.callback import SweepReport
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.report.render import report_runs
from litlab.report.stats import estimate
from litlab.run import sweep_record

CODE = "8373778d" + "a" * 32  # the user's code before an edit
EDITED = "c6928336" + "b" * 32  # and after it
PRECISION_VALUES = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def summary(
    *,
    seed: int = 1,
    precision: str = "fp32",
    samples_per_second: float = 1000.0,
    val_acc: float = 0.9,
    status: str = "completed",
    code: str = CODE,
    settings: dict[str, Any] | None = None,
    groups: dict[str, str] | None = None,
    overrides: list[str] | None = None,
    started_at: str = "2026-12-01T10:00:00",
    **fields: Any,
) -> dict[str, Any]:
    """A run's summary.json with the settings it ran (``settings`` over these defaults)."""
    ran = {
        "seed": seed,
        "precision.name": precision,
        "precision.value": PRECISION_VALUES[precision],
        "trainer.max_epochs": 10,
        "trainer.accumulate_grad_batches": 1,
        "trainer.devices": 1,
        "trainer.num_nodes": 1,
        "data.batch_size": 64,
        "model._target_": "tasks.Mlp",
        **(settings or {}),
    }
    run_name = "default-" + hashlib.sha1(json.dumps(ran, sort_keys=True).encode()).hexdigest()[:10]
    measured = status == "completed"
    return {
        "status": status,
        "error": None if status == "completed" else "RuntimeError: CUDA out of memory",
        "run_name": run_name,
        "run_dir": f"/logs/train/runs/{run_name}-{code[:8]}",
        "storage_dir": f"/storage/{run_name}-{code[:8]}",  # an edit trains in a folder of its own
        "groups": groups or {"precision": precision, "model": "mlp"},
        "overrides": overrides if overrides is not None else [f"precision={precision}", f"seed={seed}"],
        "optimized_metric": "val/acc",
        "optimized_metric_mode": "max",
        "precision": {"requested": ran["precision.value"], "effective": ran["precision.value"]},
        "devices": 1,
        "num_nodes": 1,
        "micro_batch_size": ran["data.batch_size"],
        "accumulate_grad_batches": ran["trainer.accumulate_grad_batches"],
        "effective_batch_size": ran["data.batch_size"] * ran["trainer.accumulate_grad_batches"],
        "metrics": {"val/acc": val_acc} if measured else {},
        "throughput": {"samples_per_second": samples_per_second} if measured else {},
        "memory": {"kind": "cpu_rss", "peak_mib": 500.0, "peak_rss_mib_per_rank": [500.0]},
        "started_at": started_at,
        "finished_at": started_at and started_at.replace("T10:", "T11:"),
        "code_fingerprint": code,
        "settings": ran,
        "resumed_across": [],
        **fields,
    }


def write_sweep(
    sweep_dir: Path,
    summaries: list[dict[str, Any]],
    *,
    outcomes: dict[int, str] | None = None,
    notes: dict[int, str] | None = None,
    same_runs: list[dict[str, Any]] | None = None,
    processes: dict[int, dict[str, Any]] | None = None,
) -> Path:
    """A sweep folder holding only its record: job n ended with ``summaries[n]`` (trained, unless
    ``outcomes`` says otherwise; a running job's watching process in ``processes``)."""
    record = sweep_dir / sweep_record.RECORD_DIR
    record.mkdir(parents=True)
    arguments = sorted({o for s in summaries for o in s["overrides"]})
    sweep = {"arguments": arguments, "same_runs": same_runs or []}
    (record / sweep_record.SWEEP_FILE).write_text(json.dumps(sweep))
    for job_num, ended in enumerate(summaries):
        entry = {
            "job_num": job_num,
            "outcome": (outcomes or {}).get(job_num, sweep_record.TRAINED),
            "note": (notes or {}).get(job_num),
            "run_dir": ended["run_dir"],
            "overrides": ended["overrides"],
            "summary": ended,
            "process": (processes or {}).get(job_num),
        }
        (record / f"{job_num}.json").write_text(json.dumps(entry))
    return sweep_dir


def sweep_config(sweep_dir: Path) -> Any:
    return OmegaConf.create({"task_name": "train", "hydra": {"sweep": {"dir": str(sweep_dir)}}})


def csv_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "report.csv").open() as file:
        return list(csv.DictReader(file))


def test_a_sweeps_report_is_its_record_not_the_run_folders_its_jobs_link(tmp_path):
    jobs = [summary(precision="fp32"), summary(precision="bf16", samples_per_second=1500.0)]
    sweep = write_sweep(tmp_path / "sweep", jobs)
    # Later, resume=never trained job 1's run again: its folder, which the sweep links, holds another run.
    replaced = tmp_path / "runs" / "bf16"
    replaced.mkdir(parents=True)
    (replaced / "summary.json").write_text(json.dumps({**jobs[1], "throughput": {"samples_per_second": 9.0}}))
    (sweep / "1").symlink_to(replaced, target_is_directory=True)
    moved = sweep.rename(tmp_path / "moved")  # and the sweep's folder was moved

    report = report_runs([moved], moved)
    assert [row["run"] for row in report.rows] == ["#0", "#1"]
    assert [row["samples_per_second"] for row in report.rows] == [
        job["throughput"]["samples_per_second"] for job in jobs
    ]
    assert [row["run_dir"] for row in report.rows] == [job["run_dir"] for job in jobs]
    speed_up = jobs[1]["throughput"]["samples_per_second"] / jobs[0]["throughput"]["samples_per_second"]
    assert report.rows[1]["speed_up"] == pytest.approx(speed_up)


def test_jobs_that_train_the_same_run_are_one_row_and_a_note_says_it_ran_once(tmp_path):
    ran = summary(overrides=["optimizer.lr=0.002"], settings={"optimizer.lr": 0.002})
    same = [{"overrides": ["optimizer.lr=2e-3"], "same_as": 0}]
    sweep = write_sweep(tmp_path, [ran], same_runs=same)
    report = report_runs([sweep], sweep)
    assert report.run_count == 1 and len(report.rows) == 1
    note = "the overrides `optimizer.lr=2e-3` train the same run as #0: it ran once"
    assert report.notes == [note]
    assert f"- {note}." in (sweep / "report.md").read_text()


def test_a_run_reached_by_two_sweeps_is_counted_once(tmp_path):
    throughput = {1: 1000.0, 2: 1010.0, 3: 990.0}
    runs = {seed: summary(seed=seed, samples_per_second=throughput[seed]) for seed in throughput}
    monday = write_sweep(tmp_path / "monday", [runs[1], runs[2]])
    # Tuesday's seed=2,3: seed 2 had completed on Monday, so its job skipped it and recorded that run.
    note = sweep_record.skipped_note(runs[2])
    tuesday = write_sweep(
        tmp_path / "tuesday", [runs[2], runs[3]], outcomes={0: sweep_record.SKIPPED}, notes={0: note}
    )
    report = report_runs([monday, tuesday], tmp_path / "out")
    (row,) = report.rows
    assert (row["run"], row["n"], report.run_count) == ("monday/0, monday/1, tuesday/1", 3, 3)
    assert row["samples_per_second_values"] == list(throughput.values())  # each run once
    assert row["samples_per_second"] == pytest.approx(statistics.fmean(throughput.values()))
    assert report.notes == [
        f"monday/1, tuesday/0 are attempts of one run ({runs[2]['run_name']}, completed): "
        "counted once, as monday/1"
    ]
    assert csv_rows(tmp_path / "out")[0]["n"] == "3"
    assert "## Counted once" in (tmp_path / "out" / "report.md").read_text()


def test_runs_of_two_code_versions_are_two_rows_each_compared_within_its_version(tmp_path):
    def version(code: str, started_at: str) -> list[dict[str, Any]]:
        return [
            summary(seed=1, code=code, started_at=started_at, samples_per_second=1000.0),
            summary(seed=2, code=code, started_at=started_at, samples_per_second=1020.0),
            summary(precision="bf16", code=code, started_at=started_at, samples_per_second=1500.0),
        ]

    before = write_sweep(tmp_path / "before", version(CODE, "2026-12-01T10:00:00"))
    after = write_sweep(tmp_path / "after", version(EDITED, "2026-12-02T10:00:00"))
    report = report_runs([before, after], tmp_path / "out")
    assert [row["run"] for row in report.rows] == [
        "before/0, before/1",
        "before/2",
        "after/0, after/1",
        "after/2",
    ]
    assert [row["n"] for row in report.rows] == [2, 1, 2, 1]
    assert [row["baseline"] for row in report.rows] == ["before/0, before/1"] * 2 + ["after/0, after/1"] * 2
    assert [row["differs"] for row in report.rows] == [{"code": c[:8]} for c in (CODE, CODE, EDITED, EDITED)]
    assert "code" in report.swept_keys and "code" in report.context_keys
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"code differs: {CODE[:8]}" in markdown and f"code differs: {EDITED[:8]}" in markdown


def test_a_sweep_file_that_fixes_other_values_is_another_row_showing_what_ran(tmp_path):
    plain = write_sweep(tmp_path / "plain", [summary(), summary(precision="bf16")])
    fixed = {"trainer.max_epochs": 2, "data.batch_size": 16}  # what sweep=short sets besides its axes
    short = [
        summary(settings=fixed, overrides=["sweep=short", "precision=fp32", "seed=1"]),
        summary(precision="bf16", settings=fixed, overrides=["sweep=short", "precision=bf16", "seed=1"]),
    ]
    short_dir = write_sweep(tmp_path / "short", short)
    report = build_report(collect_runs([plain, short_dir]))
    assert [row["n"] for row in report.rows] == [1, 1, 1, 1]
    assert [row["baseline"] for row in report.rows] == ["plain/0", "plain/0", "short/0", "short/0"]
    assert [row["differs"] for row in report.rows] == [{"trainer.max_epochs": e} for e in (10, 10, 2, 2)]
    assert [row["micro_batch_size"] for row in report.rows] == [64, 64, 16, 16]
    assert set(report.swept_keys) == {"precision", "trainer.max_epochs", "data.batch_size"}


def test_a_config_group_whose_choice_differs_is_one_key_of_what_differs(tmp_path):
    # experiment=a and experiment=b choose the model: the report names the model, not its keys.
    def model(choice: str, experiment: str, **settings: Any) -> dict[str, Any]:
        groups = {"precision": "fp32", "model": choice, "experiment": experiment}
        target = {"model._target_": f"tasks.{choice.title()}", **settings}
        return summary(settings=target, groups=groups, overrides=[f"experiment={experiment}"])

    runs = [model("mlp", "a", **{"model.width": 128}), model("cnn", "b", **{"model.channels": 32})]
    runs.append(model("mlp", "c", **{"model.width": 256}))  # mlp again, wider: that key is shown
    report = build_report(collect_runs([write_sweep(tmp_path, runs)]))
    assert set(report.swept_keys) == {"model", "model.width"}
    assert [row["differs"] for row in report.rows] == [
        {"model": "mlp", "model.width": 128},
        {"model": "cnn", "model.width": None},
        {"model": "mlp", "model.width": 256},
    ]


def test_a_run_resumed_across_a_code_change_is_marked_and_kept_out_of_tests(tmp_path):
    fp32 = {1: 1000.0, 2: 1010.0, 3: 990.0}
    bf16 = {1: 1500.0, 2: 1530.0, 3: 1470.0}
    change = f"code {CODE[:8]}→{EDITED[:8]}"
    jobs = []
    for seed in fp32:
        resumed = [change] if seed == 3 else []
        jobs.append(summary(seed=seed, samples_per_second=fp32[seed], code=EDITED, resumed_across=resumed))
        jobs.append(summary(seed=seed, precision="bf16", samples_per_second=bf16[seed], code=EDITED))
    sweep = write_sweep(tmp_path, jobs)
    report = report_runs([sweep], sweep)
    base, compared, resumed = report.rows
    assert (base["run"], compared["run"], resumed["run"]) == ("#0, #2", "#1, #3, #5", "#4")
    assert resumed["resumed_across"] == [change] and base["resumed_across"] == []
    clean = [fp32[1], fp32[2]]  # the runs that trained under one code version only
    assert compared["speed_up_p_value"] == pytest.approx(
        stats.ttest_ind(list(bf16.values()), clean, equal_var=False).pvalue
    )
    assert resumed["baseline"] == "#0, #2" and resumed["speed_up"] == pytest.approx(
        990.0 / statistics.fmean(clean)
    )
    assert resumed["speed_up_p_value"] is None and resumed["metric_delta_p_value"] is None
    markdown = (sweep / "report.md").read_text()
    assert f"completed; resumed across code {CODE[:8]}→{EDITED[:8]}" in markdown
    assert "not tested (resumed across a change)" in markdown
    assert [row["resumed_across"] for row in csv_rows(sweep)] == ["", "", change]


def test_no_p_value_against_a_baseline_resumed_across_a_change(tmp_path):
    change = "settings 1a2b3c4d→5e6f7a8b"
    fp32, bf16 = [1000.0, 1010.0], [1500.0, 1530.0]  # samples/s of seeds 1 and 2
    jobs = [summary(seed=s + 1, samples_per_second=v, resumed_across=[change]) for s, v in enumerate(fp32)]
    jobs += [summary(seed=s + 1, precision="bf16", samples_per_second=v) for s, v in enumerate(bf16)]
    sweep = write_sweep(tmp_path, jobs)
    report = report_runs([sweep], sweep)
    base, compared = report.rows
    assert base["is_baseline"] and compared["baseline"] == "#0, #1"
    speed_up = statistics.fmean(bf16) / statistics.fmean(fp32)
    assert compared["speed_up"] == pytest.approx(speed_up)
    assert (compared["speed_up_p_value"], compared["speed_up_significant"]) == (None, None)
    assert compared["not_tested"] == "resumed across a change"
    markdown = (sweep / "report.md").read_text()
    assert "resumed across settings 1a2b3c4d→5e6f7a8b" in markdown
    (words,) = [line for line in markdown.splitlines() if line.startswith("- ") and "#2, #3" in line]
    assert f"speed-up {speed_up:.2f}x not tested (resumed across a change)" in words


def test_only_a_completed_row_can_be_the_headlines_best(tmp_path):
    completed = summary(val_acc=0.9)
    # A run that trained, then failed: its metric is not a result.
    failed = summary(precision="bf16", status="failed", metrics={"val/acc": 0.99})
    sweep = write_sweep(tmp_path, [completed, failed])
    report_runs([sweep], sweep)
    assert "Highest val/acc: 0.9000 (#0)." in (sweep / "report.md").read_text()


def test_an_interrupted_run_is_shown_as_interrupted_and_resumable_not_failed(tmp_path):
    stopped = summary(precision="bf16", status="interrupted", error="SIGTERMException: ")
    sweep = write_sweep(tmp_path, [summary(), stopped])
    with pytest.raises(SystemExit) as exit:  # the sweep still exits non-zero: a run is left to finish
        SweepReport().on_multirun_end(sweep_config(sweep))
    assert exit.value.code == 1
    report = build_report(collect_runs([sweep]))
    assert [row for row in report.rows if row["status"] == "failed"] == []
    assert [row["run"] for row in report.unfinished] == ["#1"]
    assert report.rows[1]["error"] == "stopped by SIGTERM; the same command resumes it"
    markdown = (sweep / "report.md").read_text()
    assert "| interrupted |" in markdown and "**failed**" not in markdown
    assert "SIGTERMException" not in markdown and "1 completed, 1 interrupted, 0 failed" in markdown
    assert csv_rows(sweep)[1]["error"] == "stopped by SIGTERM; the same command resumes it"


def test_a_job_whose_run_was_running_elsewhere_is_shown_as_such_and_fails_the_sweep(tmp_path):
    why = "run default-x is being trained by another process (pid 4242 on host a)"
    elsewhere = summary(precision="bf16", status="running elsewhere", error=why)
    sweep = write_sweep(tmp_path, [summary(), elsewhere], outcomes={1: sweep_record.ELSEWHERE})
    with pytest.raises(SystemExit) as exit:
        SweepReport().on_multirun_end(sweep_config(sweep))
    assert exit.value.code == 1
    markdown = (sweep / "report.md").read_text()
    assert "| running elsewhere |" in markdown and "**failed**" not in markdown and why in markdown
    report = build_report(collect_runs([sweep]))
    assert [row for row in report.rows if row["status"] == "failed"] == []


def test_a_skipped_job_shows_where_and_when_its_run_completed(tmp_path):
    earlier = summary(sweep={"dir": "/logs/train/multiruns/monday", "job_num": 3})
    note = sweep_record.skipped_note(earlier)
    sweep = write_sweep(
        tmp_path, [earlier, summary(precision="bf16")], outcomes={0: sweep_record.SKIPPED}, notes={0: note}
    )
    report = report_runs([sweep], sweep)
    assert report.skipped == [f"#0: {note}"]
    lines = (sweep / "report.md").read_text().splitlines()
    assert lines[lines.index("## Skipped") :].count(f"- #0: {note}.") == 1
    assert "by job 3 of sweep /logs/train/multiruns/monday" in note and "not trained again" in note


def test_litlab_compare_exits_1_after_writing_a_report_with_a_row_that_did_not_complete(tmp_path, capsys):
    stopped = write_sweep(tmp_path / "stopped", [summary(), summary(precision="bf16", status="interrupted")])
    with pytest.raises(SystemExit) as exit:
        compare_main([str(stopped)])
    assert exit.value.code == 1 and (stopped / "report.md").is_file()
    line = capsys.readouterr().err.strip().splitlines()[-1]  # the last line of stderr
    assert line.startswith("litlab-compare: 1 of 2 rows did not complete"), line
    pruned = write_sweep(tmp_path / "pruned", [summary(), summary(precision="bf16", status="pruned")])
    compare_main([str(pruned)])  # a pruned trial is not a row that did not complete: exit 0
    assert (pruned / "report.md").is_file()


def test_the_report_callback_reports_a_sweep_whose_jobs_were_all_skipped(tmp_path):
    # hydra.sweep.subdir put the jobs' folders elsewhere: the sweep's folder holds its record only.
    runs = [summary(), summary(precision="bf16")]
    notes = {n: sweep_record.skipped_note(run) for n, run in enumerate(runs)}
    skipped = dict.fromkeys(notes, sweep_record.SKIPPED)
    sweep = write_sweep(tmp_path, runs, outcomes=skipped, notes=notes)
    SweepReport().on_multirun_end(sweep_config(sweep))  # every run completed: no SystemExit
    markdown = (sweep / "report.md").read_text()
    assert "2 runs (2 completed, 0 failed)" in markdown and "## Skipped" in markdown


def test_a_sweep_that_stopped_before_any_job_writes_and_says_no_report(tmp_path, monkeypatch, caplog):
    # -m precision=fp32,fp61: the sweep ends before any job; Hydra never calls on_multirun_end, the
    # report is left to the process's exit, and the sweep's one line is its last.
    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda function, *args: at_exit.append((function, args)))
    callback = SweepReport()
    callback.on_multirun_start(sweep_config(tmp_path))
    ((function, args),) = at_exit
    with caplog.at_level(logging.INFO, logger="litlab.report"):
        function(*args)
    assert not (tmp_path / "report.md").exists()
    assert [r for r in caplog.records if r.name.startswith("litlab.report")] == []


def test_the_solo_timing_advice_trains_the_runs_again_with_resume_never(tmp_path):
    shared = {"dir": str(tmp_path), "job_num": 0, "beside": [1]}
    sweep = write_sweep(tmp_path, [summary(sweep=shared), summary(precision="bf16", sweep=shared)])
    report_runs([sweep], sweep)
    (line,) = [line for line in (sweep / "report.md").read_text().splitlines() if "solo timing" in line]
    assert "run the sweep again with `hydra.launcher.devices=1 resume=never`" in line


def gone_process() -> dict[str, Any]:
    """A record's ``process`` of a process that has ended (the sweep killed)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return {"host": socket.gethostname(), "pid": child.pid, "started": time.time() - 5}


def this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def test_a_killed_sweep_reports_its_interrupted_and_never_started_jobs(tmp_path):
    """SIGKILL once job 1 trained: the report said "1 runs (1 completed, 0 failed)", exit 0."""
    running = summary(precision="bf16", status="running", started_at="2026-12-01T10:05:00")
    planned = summary(precision="bf16", seed=2, status="not started", started_at=None)
    outcomes = {1: "running", 2: "planned"}
    killed = write_sweep(
        tmp_path / "killed", [summary(), running, planned], outcomes=outcomes, processes={1: gone_process()}
    )
    report = report_runs([killed], killed)
    assert [row["status"] for row in report.rows] == ["completed", "interrupted", "not started"]
    assert "the same command resumes it" in report.rows[1]["error"]
    assert (
        "3 runs (1 completed, 1 interrupted, 1 not started, 0 failed)" in (killed / "report.md").read_text()
    )
    # Compared while the sweep runs: the job its live process watches is running.
    live = write_sweep(
        tmp_path / "live", [summary(), running, planned], outcomes=outcomes, processes={1: this_process()}
    )
    assert [row["status"] for row in build_report(collect_runs([live])).rows] == [
        "completed",
        "running",
        "not started",
    ]
    with pytest.raises(SystemExit) as exit:
        compare_main([str(live)])
    assert exit.value.code == 1


def test_an_interrupted_sweep_compared_with_its_rerun_counts_each_run_once_with_its_final_status(
    tmp_path, capsys
):
    """It said "5 runs (3 completed, 1 interrupted, 1 failed)", exit 1, of 3 runs that all completed."""
    first = summary(seed=1)
    cut = summary(seed=2, status="interrupted", error="SIGTERMException: ")
    killed = summary(seed=3, status="failed", error="killed by SIGTERM", started_at=None)
    monday = write_sweep(tmp_path / "monday", [first, cut, killed])
    resumed = summary(seed=2, started_at="2026-12-02T10:00:00")
    tuesday = write_sweep(
        tmp_path / "tuesday",
        [first, resumed, summary(seed=3, started_at="2026-12-02T11:00:00")],
        outcomes={0: sweep_record.SKIPPED},
    )
    compare_main([str(monday), str(tuesday), "--out", str(tmp_path / "out")])  # exit 0: no SystemExit
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "3 runs (3 completed, 0 failed)" in markdown
    (row,) = csv_rows(tmp_path / "out")
    assert (row["n"], row["seeds"]) == ("3", "1;2;3")


def test_n_counts_distinct_seeds_a_seed_run_again_adds_a_timing_only(tmp_path):
    """``seed=1,2`` beside each other, then again with ``resume=never hydra.launcher.devices=1`` (the
    recipe for solo timings): it said "n=4, seeds 1, 2, 1, 2", and narrowed every interval."""
    accuracy = {1: 0.86, 2: 0.88}
    shared = {1: 700.0, 2: 720.0}
    solo = {1: 1000.0, 2: 1030.0}

    def sweep(name: str, throughput: dict[int, float], beside: bool, started_at: str) -> Path:
        pool = {"dir": name, "job_num": 0, "beside": [1] if beside else [], "timed_by": f"host {name}"}
        runs = [
            summary(
                seed=seed,
                val_acc=accuracy[seed],
                samples_per_second=throughput[seed],
                sweep=pool,
                started_at=started_at,
            )
            for seed in (1, 2)
        ]
        return write_sweep(tmp_path / name, runs)

    shared_sweep = sweep("shared", shared, beside=True, started_at="2026-12-01T10:00:00")
    solo_sweep = sweep("solo", solo, beside=False, started_at="2026-12-01T12:00:00")
    (row,) = build_report(collect_runs([shared_sweep, solo_sweep])).rows
    assert (row["n"], row["seeds"], row["metric_values"]) == (2, [1, 2], [0.86, 0.88])
    mean, low, high = estimate(accuracy.values())
    assert (row["metric"], row["metric_ci95_low"], row["metric_ci95_high"]) == (mean, low, high)
    # The solo timings alone: none taken beside other jobs is combined with them.
    assert (row["timings"], row["samples_per_second_values"], row["shared_node"]) == (
        2,
        [1000.0, 1030.0],
        False,
    )


def test_the_runs_resume_never_set_aside_are_not_runs_of_a_folder_of_runs(tmp_path):
    runs = tmp_path / "runs"
    for name in ("default-1a2b3c4d5e", "default-1a2b3c4d5e.replaced-2026-12-01_10-00-00"):
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(json.dumps(summary()))
    assert [run.label for run in collect_runs([runs])] == ["#default-1a2b3c4d5e"]


def test_a_skipped_job_keeps_the_conditions_of_the_attempt_that_timed_it(tmp_path):
    """``-m precision=fp32,bf16 hydra.launcher.devices=2`` (shared: †), then ``precision=fp32,bf16,fp16``:
    the skipped rows lost their †, and fp16's 0.08x was against that disturbed baseline, unmarked; and
    ``litlab-compare S2 S1`` showed no † where ``S1 S2`` did."""
    first, second = tmp_path / "first", tmp_path / "second"
    ran = {
        p: summary(precision=p, sweep={"dir": str(first), "job_num": n})
        for n, p in enumerate(["fp32", "bf16"])
    }
    for job, run in enumerate(ran.values()):  # the pool's record of each attempt: beside the other job
        pool = {"devices": [str(job)], "beside": [1 - job], "timed_by": "host 10:00"}
        sweep_record.write_job(
            first, job, sweep_record.TRAINED, run, run_dir=tmp_path / str(job), overrides=[], pool=pool
        )
    for job, run in enumerate(ran.values()):  # found completed: their summary.json as the runs wrote it
        sweep_record.write_job(
            second, job, sweep_record.SKIPPED, run, run_dir=tmp_path / str(job), overrides=[]
        )
    fp16 = summary(precision="fp16", samples_per_second=80.0)
    pool = {"devices": ["0"], "beside": [], "timed_by": "host 11:00"}
    sweep_record.write_job(
        second, 2, sweep_record.TRAINED, fp16, run_dir=tmp_path / "2", overrides=[], pool=pool
    )
    report = report_runs([second], second)
    assert [row["shared_node"] for row in report.rows] == [True, True, False]
    assert report.rows[2]["speed_up"] == pytest.approx(80.0 / 1000.0)
    assert (report.rows[2]["timed_apart"], report.rows[2]["speed_up_p_value"]) == (True, None)
    markdown = (second / "report.md").read_text()
    assert (
        "| completed † |" in markdown
        and "0.08x ‡" in markdown
        and "‡ Timed under other conditions" in markdown
    )

    def figures(report: Any) -> list[tuple[Any, ...]]:
        return [
            (r["status"], r["samples_per_second"], r["shared_node"], r["timed_apart"], r["speed_up"])
            for r in report.rows
        ]

    one_way = build_report(collect_runs([first, second]))
    assert figures(one_way) == figures(build_report(collect_runs([second, first])))
    assert [row["shared_node"] for row in one_way.rows] == [True, True, False]


def test_a_rerun_after_a_crash_marks_a_speed_up_against_a_baseline_timed_by_the_earlier_start(tmp_path):
    """The same command after a crash: bf16 got "15.57x" against fp32 timed 20 minutes earlier."""
    sweep = tmp_path / "sweep"
    fp32 = summary(sweep={"dir": str(sweep), "job_num": 0})
    pool = {"beside": [], "timed_by": "host 10:00"}
    sweep_record.write_job(
        sweep, 0, sweep_record.TRAINED, fp32, run_dir=tmp_path / "0", overrides=[], pool=pool
    )
    sweep_record.write_job(
        sweep, 0, sweep_record.SKIPPED, fp32, run_dir=tmp_path / "0", overrides=[]
    )  # again
    bf16 = summary(precision="bf16", samples_per_second=15570.0, started_at="2026-12-01T10:20:00")
    pool = {"beside": [], "timed_by": "host 10:20"}
    sweep_record.write_job(
        sweep, 1, sweep_record.TRAINED, bf16, run_dir=tmp_path / "1", overrides=[], pool=pool
    )
    entry = sweep_record.read(sweep)[0][0]
    assert entry["outcome"] == "skipped" and [e["outcome"] for e in entry["earlier"]] == ["trained"]
    base, row = build_report(collect_runs([sweep])).rows
    assert (row["speed_up"], row["timed_apart"], base["timed_apart"]) == (15.57, True, False)
