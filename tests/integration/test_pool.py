"""The default launcher's pool of devices, with real multiruns on the CPU (``hydra.launcher.devices=2``:
two slots, scheduled as two GPUs would be). Every job is a process of its own; jobs that must run at
the same time prove it by meeting at train start (``tests.faults.MeetAtTrainStart``), not by times.
The scheduler's order and backfill are covered in-process by tests/unit/test_pool.py, and a job larger
than a pool of GPUs (a failed row, never started) by tests/unit/test_sweep_plan.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from litlab.cli.compare import main as compare_main
from litlab.launch.pool import cpu_share
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.run import sweep_record
from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ranks_that_joined, start_litlab
from tests.integration.test_sweeps import job_dirs, report_rows

pytestmark = pytest.mark.slow

CASES = Path(__file__).parents[1] / "configs"  # tests/configs/pool_case/*.yaml
SEARCHPATH = f"hydra.searchpath=[file://{CASES}]"
BASE = ["model=mlp", *TINY]


def recorded_summaries(sweep_dir: Path) -> list[dict]:
    """Each job's summary as the sweep's record holds it, with the pool's own record of the job in its
    ``sweep`` (devices, start, end, beside, command): the pool never rewrites a run's summary.json."""
    return [entry["summary"] for entry in sweep_record.read(sweep_dir)[0]]


def summaries_by_case(sweep_dir: Path) -> dict[str, dict]:
    return {run["groups"]["pool_case"]: run for run in recorded_summaries(sweep_dir)}


def test_jobs_share_the_pool_largest_first_with_distinct_devices_and_the_cores_split(tmp_path):
    """One multirun on a pool of 2: a 2-device DDP job (alone, both ids), then long and short_a at
    once on distinct ids, and short_b on short_a's id once it ended, while long still ran."""
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    env = {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(tmp_path / "logs"), "LITLAB_TEST_MEET": f"{meeting}:0"}
    cases = "ddp2,long,short_a,short_b"
    result = litlab(
        "litlab-train",
        "-m",
        SEARCHPATH,
        f"+pool_case={cases}",
        "hydra.launcher.devices=2",
        *BASE,
        env=env,
        timeout=480,
    )
    output = result.stdout[-4000:] + result.stderr[-4000:]
    assert result.returncode == 0, output
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    runs = summaries_by_case(sweep_dir)
    assert set(runs) == set(cases.split(",")), output
    ddp2, long, short_a, short_b = (runs[c] for c in cases.split(","))
    for run in (ddp2, long, short_a, short_b):
        assert run["status"] == "completed", (run["run_dir"], run["error"], output)

    # The 2-device job got both ids, ran alone (the largest first), its 2 ranks in one group.
    assert ddp2["sweep"]["devices"] == ["0", "1"] and ddp2["sweep"]["beside"] == []
    assert ranks_that_joined(Path(ddp2["run_dir"])) == ["0 1/2", "1 2/2"]
    assert [r["status"] for r in report_rows(sweep_dir)].count("failed") == 0

    # long and short_a met (so they ran at the same time) on distinct ids; short_b reached the
    # meeting long was still waiting at, on the id short_a had given back.
    assert len(long["sweep"]["devices"]) == len(short_a["sweep"]["devices"]) == 1
    assert long["sweep"]["devices"] != short_a["sweep"]["devices"]
    assert short_b["sweep"]["devices"] == short_a["sweep"]["devices"]
    assert short_b["sweep"]["start"] >= short_a["sweep"]["end"]
    assert long["sweep"]["beside"] == sorted([short_a["sweep"]["job_num"], short_b["sweep"]["job_num"]])
    assert short_a["sweep"]["beside"] == [long["sweep"]["job_num"]]

    # Each process saw its share of the cores, as affinity and torch threads (2 slots), no more
    # threads than an OMP_NUM_THREADS the sweep had.
    cores = sorted(os.sched_getaffinity(0))
    cap = int(os.environ.get("OMP_NUM_THREADS") or len(cores))
    met = [json.loads(p.read_text()) for p in meeting.iterdir()]
    assert len(met) == 3
    for case, run in (("long", long), ("short_a", short_a), ("short_b", short_b)):
        (given,) = [g for g in met if f"+pool_case={case}" in g["argv"]]
        share = cpu_share(int(run["sweep"]["devices"][0]), 2, cores)
        assert given["cpus"] == share and given["threads"] == min(len(share), cap), (case, given)
        assert given["cuda"] is None  # slots, not GPUs: no CUDA_VISIBLE_DEVICES
    assert ddp2["torch_flags"]["num_threads"] == max(1, min(len(cores) // 2, cap))  # 2 ranks, all cores

    # Every started job: its process's command, pasteable, and its output.
    for run in (ddp2, long, short_a, short_b):
        job_dir = Path(run["run_dir"])
        command = (job_dir / "command.sh").read_text()
        assert run["sweep"]["command"] in command and "-m litlab.cli.train" in command
        assert "hydra.mode=RUN" in command and " -m " not in command.split("litlab.cli.train", 1)[1]
        assert "[litlab][INFO] run " in (job_dir / "output.log").read_text()
        # The run's own summary.json names its sweep and job; the pool's record is the sweep's.
        own = json.loads((job_dir / "summary.json").read_text())["sweep"]
        assert own == {"dir": str(sweep_dir), "job_num": run["sweep"]["job_num"]}
    assert ddp2["sweep"]["start"] < ddp2["sweep"]["end"] <= long["sweep"]["start"]


def test_without_gpus_a_ddp_job_larger_than_the_pool_runs_alone_on_it_with_no_launcher_flag(tmp_path):
    """``-m trainer.devices=1,2 strategy=ddp`` on a machine without GPUs: the default pool has one
    slot, and the 2-process job runs alone on it (it used to be a failed row: "set
    hydra.launcher.devices")."""
    env = {"LITLAB_LOG_DIR": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1"}
    result = litlab("litlab-train", "-m", "trainer.devices=1,2", "strategy=ddp", *BASE, env=env, timeout=480)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    one, two = recorded_summaries(sweep_dir)
    assert one["status"] == two["status"] == "completed" and two["world_size"] == 2
    assert one["sweep"]["devices"] == two["sweep"]["devices"] == ["0"]
    assert one["sweep"]["beside"] == two["sweep"]["beside"] == []
    assert ranks_that_joined(Path(two["run_dir"])) == ["0 1/2", "1 2/2"]


def held_jobs(sweep_root: Path) -> int:
    return sum("holding at step" in p.read_text() for p in sweep_root.glob("*/*/output.log"))


def test_sigterm_stops_every_job_with_a_checkpoint_and_the_same_command_finishes_only_what_was_left(
    tmp_path,
):
    """Job 0 (2 batches) completes; jobs 1 and 2 hold at step 3 until the sweep's SIGTERM reaches
    them. The same command again: job 0 skipped, jobs 1 and 2 resumed from their preempted.ckpt."""
    log_dir = tmp_path / "logs"
    command = [
        "-m",
        "hydra.launcher.devices=2",
        "trainer.limit_train_batches=2,8,9",
        "+callbacks.hold._target_=tests.faults.HoldAt",
        *(t for t in BASE if not t.startswith("trainer.limit_train_batches")),
    ]
    env = {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(log_dir), "OMP_NUM_THREADS": "1"}
    sweep = start_litlab("litlab-train", *command, env={**env, "LITLAB_TEST_HOLD_AT": "SIGTERM:3"})
    multiruns = log_dir / "train" / "multiruns"
    deadline = time.monotonic() + 240
    while held_jobs(multiruns) < 2 and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held_jobs(multiruns) == 2, sweep.communicate(timeout=60)[0][-4000:]
    (live,) = multiruns.iterdir()  # compared mid-sweep: what ran, what runs
    assert [row["status"] for row in build_report(collect_runs([live])).rows] == [
        "completed",
        "running",
        "running",
    ]
    sweep.send_signal(signal.SIGTERM)
    output, _ = sweep.communicate(timeout=120)
    assert sweep.returncode == 143, output[-4000:]
    assert "sweep stopped by SIGTERM" in output
    (first,) = multiruns.iterdir()
    before = [json.loads((job / "summary.json").read_text()) for job in job_dirs(first)]
    assert [run["status"] for run in before] == ["completed", "interrupted", "interrupted"], output[-4000:]
    for run in before[1:]:  # each job wrote its preempted checkpoint
        assert (Path(run["checkpoints"]["dir"]) / "preempted.ckpt").is_file(), run
    # No job process outlived the sweep.
    assert subprocess.run(["pgrep", "-f", str(first)], capture_output=True).stdout == b""

    result = litlab("litlab-train", *command, env=env, timeout=480)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    second = next(p for p in multiruns.iterdir() if p != first)
    after = [json.loads((job / "summary.json").read_text()) for job in job_dirs(second)]
    assert [run["status"] for run in after] == ["completed"] * 3
    # Completed before: not started again, its run folder (listed as job 0) as the first sweep left it.
    assert after[0] == before[0] and after[0]["sweep"]["dir"] == str(first)
    assert [run["resumed_count"] for run in after[1:]] == [1, 1]  # from the preempted checkpoints
    assert [run["global_step"] for run in after] == [2, 8, 9]
    assert "job 0: run" in result.stdout and "already completed, skipped" in result.stdout
    # Each sweep's record says what it did: the first trained job 0 and stopped 1 and 2; the second
    # skipped job 0 (completed by the first) and trained the others on.
    first_jobs, second_jobs = sweep_record.read(first)[0], sweep_record.read(second)[0]
    assert [(j["outcome"], j["summary"]["status"]) for j in first_jobs] == [
        ("trained", "completed"),
        ("trained", "interrupted"),
        ("trained", "interrupted"),
    ]
    assert [j["outcome"] for j in second_jobs] == ["skipped", "trained", "trained"]
    assert f"job 0 of sweep {first}" in second_jobs[0]["note"]
    assert second_jobs[0]["summary"]["sweep"]["skipped"] is True  # its copy in the record says so
    # The first sweep's report is what it did, though its runs completed since; compared with its
    # re-run, each run counts once with its final status (it said 5 runs, 2 interrupted).
    assert [row["status"] for row in build_report(collect_runs([first])).rows] == ["completed"] + [
        "interrupted"
    ] * 2
    both = build_report(collect_runs([first, second]))
    assert (both.run_count, [row["status"] for row in both.rows]) == (3, ["completed"] * 3)


def test_a_sweep_killed_outright_reports_every_planned_job_as_it_stands(tmp_path):
    """SIGKILL once job 1 trained (one job at a time): litlab-compare said "1 runs (1 completed, 0
    failed)", exit 0. Job 1 was interrupted and job 2 never started."""
    env = {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1"}
    env["LITLAB_TEST_HOLD_AT"] = "SIGTERM:3"  # job 1 holds at step 3 (job 0 has 2 batches)
    tiny = [t for t in BASE if not t.startswith("trainer.limit_train_batches")]
    hold = "+callbacks.hold._target_=tests.faults.HoldAt"
    sweep = start_litlab("litlab-train", "-m", "trainer.limit_train_batches=2,8,9", hold, *tiny, env=env)
    multiruns = tmp_path / "logs" / "train" / "multiruns"
    deadline = time.monotonic() + 240
    while held_jobs(multiruns) < 1 and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held_jobs(multiruns) == 1, sweep.communicate(timeout=60)[0][-4000:]
    sweep.kill()
    sweep.communicate(timeout=60)
    (killed,) = multiruns.iterdir()
    with pytest.raises(SystemExit) as exit:
        compare_main([str(killed)])
    assert exit.value.code == 1
    assert (
        "3 runs (1 completed, 1 interrupted, 1 not started, 0 failed)" in (killed / "report.md").read_text()
    )
