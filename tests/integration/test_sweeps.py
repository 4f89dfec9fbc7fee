"""Real multiruns through ``litlab-train -m``: reports, failures, joblib, DDP jobs, Optuna.

Each sweep is a real Hydra multirun in a subprocess with tiny settings; the assertions recompute
what the report says from the runs' own summary.json files.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ok

# Enough batches for a steady-state throughput (RunStats skips 5 warm-up batches); the MLP keeps
# bf16 on CPU (slow for convolutions) quick.
SWEEP_TINY = [t for t in TINY if not t.startswith("trainer.limit_train_batches")] + [
    "trainer.limit_train_batches=12",  # accumulation 2: 6 optimizer steps, the last timed after 5 warm-up
    "model=mlp",
]
RANK_LINE = re.compile(r"\[rank (\d+)\]\[litlab\]\[INFO\] run (\S+) in ")


def sweep(tmp_path: Path, *args: str, expect_ok: bool = True, env: dict[str, str] | None = None):
    """Run ``litlab-train`` (a multirun) with a private log folder; returns (result, sweep dir)."""
    log_dir = tmp_path / "logs"
    # One torch thread per process: these tests start several processes on 2 cores, where more
    # threads only contend (README, "joblib").
    env = {"LITLAB_LOG_DIR": str(log_dir), "OMP_NUM_THREADS": "1", **(env or {})}
    result = litlab("litlab-train", *args, env=env, timeout=480)
    if expect_ok:
        ok(result)
    sweeps = sorted((log_dir / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps  # one sweep directory, however many processes ran
    return result, sweeps[0]


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted((d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()), key=lambda d: int(d.name))


def summaries(sweep_dir: Path) -> list[dict]:
    return [json.loads((job / "summary.json").read_text()) for job in job_dirs(sweep_dir)]


def report_rows(directory: Path) -> list[dict[str, str]]:
    with (directory / "report.csv").open() as file:
        return list(csv.DictReader(file))


def rank_lines(job_dir: Path) -> list[tuple[int, str]]:
    """(rank, run identity) of every process that started training in this job directory."""
    return [(int(m[1]), m[2]) for m in RANK_LINE.finditer((job_dir / "train.log").read_text())]


def close(value: str, expected: float) -> bool:
    return math.isclose(float(value), expected, rel_tol=1e-9, abs_tol=1e-12)


def meeting(tmp_path: Path, runs: int) -> tuple[str, dict[str, str]]:
    """The override and environment that make each job wait at train start until ``runs`` jobs
    have arrived (tests.faults.MeetAtTrainStart), and the folder where they meet."""
    folder = tmp_path / "meeting"
    folder.mkdir()
    env = {**FAULTS_IMPORTABLE, "LITLAB_TEST_MEET": f"{folder}:{runs}"}
    return "+callbacks.meet._target_=tests.faults.MeetAtTrainStart", env


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory) -> Path:
    """The sweep file with both axes replaced: precision {fp32, bf16} x accumulation {1, 2}. With the
    joblib sweep's meeting callback, each job meeting only itself: the two sweeps have the same
    settings, for litlab-compare."""
    tmp_path = tmp_path_factory.mktemp("grid")
    meet, env = meeting(tmp_path, runs=1)
    _, sweep_dir = sweep(
        tmp_path,
        "sweep=precision_accumulation",
        "precision=fp32,bf16",
        "trainer.accumulate_grad_batches=1,2",
        meet,
        *SWEEP_TINY,
        env=env,
    )
    return sweep_dir


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory) -> tuple[str, Path]:
    tmp_path = tmp_path_factory.mktemp("joblib")
    meet, env = meeting(tmp_path, runs=2)  # both jobs wait for each other at train start
    result, sweep_dir = sweep(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "trainer.accumulate_grad_batches=1,2",
        meet,
        *SWEEP_TINY,
        env=env,
    )
    return result.stdout, sweep_dir


@pytest.mark.slow
def test_grid_sweep_report_matches_the_runs_own_numbers(grid_sweep):
    runs = summaries(grid_sweep)
    assert [(s["groups"]["precision"], s["accumulate_grad_batches"]) for s in runs] == [
        ("fp32", 1),
        ("fp32", 2),
        ("bf16", 1),
        ("bf16", 2),
    ]
    for name in ("report.md", "report.csv", "report.png"):
        assert (grid_sweep / name).stat().st_size > 0
    assert (grid_sweep / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    rows = report_rows(grid_sweep)
    (base,) = [s for s in runs if s["groups"]["precision"] == "fp32" and s["accumulate_grad_batches"] == 1]
    assert [r["is_baseline"] for r in rows] == ["True", "False", "False", "False"]
    for row, run in zip(rows, runs, strict=True):
        assert row["status"] == "completed"
        assert row["precision_requested"] == run["precision"]["requested"]
        assert row["precision_effective"] == run["precision"]["effective"]
        assert int(row["effective_batch_size"]) == run["micro_batch_size"] * run["accumulate_grad_batches"]
        throughput = run["throughput"]["samples_per_second"]
        assert throughput > 0
        assert close(row["samples_per_second"], throughput)
        assert close(row["speed_up"], throughput / base["throughput"]["samples_per_second"])
        assert close(row["memory_ratio"], run["memory"]["peak_mib"] / base["memory"]["peak_mib"])
        assert close(row["delta_val/acc"], run["metrics"]["val/acc"] - base["metrics"]["val/acc"])
        assert close(row["test/acc"], run["metrics"]["test/acc"])
        assert row["baseline"] == "#0"
    table = [line for line in (grid_sweep / "report.md").read_text().splitlines() if line.startswith("| #")]
    assert len(table) == 4
    assert ["**baseline**" in line for line in table] == [True, False, False, False]
    assert (
        "![throughput, peak memory and learning curves per configuration](report.png)"
        in (grid_sweep / "report.md").read_text()
    )


@pytest.mark.slow
def test_failing_job_becomes_a_failed_row_and_the_multirun_exits_nonzero(tmp_path):
    # Job 0's network fails in its first training step (tests.faults); job 1, the plain MLP, still runs.
    # A value a single run would refuse stops the sweep before any job instead (test_sweep_plan.py).
    # `-m` typed in the middle of the command, not first as Hydra wants it: still a multirun.
    result, sweep_dir = sweep(
        tmp_path,
        "trainer.accumulate_grad_batches=2",
        "-m",
        "model.net._target_=tests.faults.MLPFailingOnOneRank,project.vision.nets.MLP",
        *SWEEP_TINY,
        expect_ok=False,
        env={**FAULTS_IMPORTABLE, "LITLAB_TEST_FAULT": "raise@0:1"},
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # Each job's folder is its run's, linked from the sweep's folder.
    runs = sorted((sweep_dir.parents[1] / "runs").iterdir())
    assert sorted(p.resolve() for p in job_dirs(sweep_dir)) == runs
    failed, completed = summaries(sweep_dir)
    assert failed["status"] == "failed"
    assert "injected failure on rank 0" in failed["error"]
    assert completed["status"] == "completed"
    assert completed["effective_batch_size"] == 2 * completed["micro_batch_size"]

    rows = report_rows(sweep_dir)
    assert [r["status"] for r in rows] == ["failed", "completed"]
    assert rows[0]["error"] == failed["error"]
    assert failed["error"] in (sweep_dir / "report.md").read_text()


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_at_the_same_time(joblib_sweep):
    stdout, sweep_dir = joblib_sweep
    assert "Joblib.Parallel(n_jobs=2" in stdout
    # Each job waited at train start until both had arrived (tests.faults.MeetAtTrainStart): had
    # joblib run them one after the other, the first would have failed waiting.
    for job in job_dirs(sweep_dir):
        assert len(rank_lines(job)) == 1  # one process trained here, and only this job's lines
    assert [r["status"] for r in report_rows(sweep_dir)] == ["completed", "completed"]
    assert len(list((sweep_dir.parents[3] / "meeting").iterdir())) == 2  # two processes met


@pytest.mark.slow
def test_compare_two_sweeps_made_at_different_times(grid_sweep, joblib_sweep, tmp_path):
    _, second = joblib_sweep
    out = tmp_path / "comparison"
    ok(litlab("litlab-compare", str(grid_sweep), str(second), "--out", str(out)))
    rows = report_rows(out)
    grid_runs, second_runs = summaries(grid_sweep), summaries(second)
    # The joblib sweep ran the grid's fp32 settings (accumulation 1 and 2) with the same code and
    # seed: those runs again, so one seed each (n = 1, never 2) with both sweeps' timings.
    g = grid_sweep.name
    assert [(r["n"], r["timings"]) for r in rows] == [("1", "2"), ("1", "2"), ("1", "1"), ("1", "1")]
    assert [r["run"] for r in rows][2:] == [f"{g}/2", f"{g}/3"]
    runs_of_rows = [
        [grid_runs[0], second_runs[0]],
        [grid_runs[1], second_runs[1]],
        [grid_runs[2]],
        [grid_runs[3]],
    ]
    # Same settings, same device count: the fp32, accumulation 1 configuration is every row's baseline.
    assert {r["baseline"] for r in rows} == {rows[0]["run"]}

    def mean_speed(runs: list[dict]) -> float:
        return sum(run["throughput"]["samples_per_second"] for run in runs) / len(runs)

    for row, runs in zip(rows, runs_of_rows, strict=True):
        assert close(row["speed_up"], mean_speed(runs) / mean_speed(runs_of_rows[0]))
    assert (out / "report.png").stat().st_size > 0


@pytest.mark.slow
def test_optuna_search_with_ddp_samples_once_per_trial_and_prunes_on_every_rank(tmp_path):
    # Trial 0 learns; trial 1 (lr 1e-7) is pruned after its first epoch: rank 0 asks the study, and
    # both ranks stop there (the decision is broadcast), so the job ends cleanly. 8 batches an epoch:
    # after 4, trial 0's val/acc was 0.115 against the untrained 0.09, too close to prune every time.
    result, sweep_dir = sweep(
        tmp_path,
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.pruning.startup_trials=1",
        'hydra.sweeper.enqueue=["optimizer.lr=0.01","optimizer.lr=1e-7"]',
        "optimizer.lr=tag(log, interval(1e-8, 1e-1))",
        "hydra.launcher.devices=2",
        "trainer.devices=2",
        "strategy=ddp",
        *[t for t in TINY if not t.startswith(("trainer.max_epochs", "trainer.limit_train_batches"))],
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=8",
    )
    jobs = job_dirs(sweep_dir)
    assert len(jobs) == 2
    identities, values = [], []
    for job in jobs:
        lines = rank_lines(job)
        assert sorted(rank for rank, _ in lines) == [0, 1], lines
        (identity,) = {identity for _, identity in lines}  # the ranks agree on the sampled overrides
        identities.append(identity)
        run = json.loads((job / "summary.json").read_text())
        assert run["world_size"] == 2
        sampled = dict(o.split("=", 1) for o in run["overrides"] if o.startswith(("optimizer.", "data.")))
        assert run["micro_batch_size"] == int(sampled["data.batch_size"]) in (16, 32, 64, 128)
        values.append((run, sampled))
    (learned, first), (pruned, second) = values
    assert learned["status"] == "completed" and float(first["optimizer.lr"]) == 0.01
    assert (
        pruned["status"] == "pruned" and pruned["pruned_epoch"] == 0 and float(second["optimizer.lr"]) == 1e-7
    )
    assert len(set(identities)) == 2  # two different samples
    best = OmegaConf.to_container(OmegaConf.load(sweep_dir / "best_trial.yaml"))
    assert math.isclose(best["value"], learned["metrics"]["val/acc"], rel_tol=1e-9)
    assert {k: str(v) for k, v in best["params"].items()} == first
    assert len(report_rows(sweep_dir)) == 2
