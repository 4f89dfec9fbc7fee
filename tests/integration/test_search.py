"""Optuna searches as users run them: real ``litlab-train hparams_search=optuna`` processes on the device
pool, a real SQLite study under the storage root, and a real PostgreSQL server shared by two sweeps.

Tiny trials (the MLP, a few batches); each trial is a process of its own (~8 s of imports), so the
tests keep to 2 trials each.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from litlab.launch.search import storage_url
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ok, start_litlab
from tests.postgres_server import postgres_server  # noqa: F401  (a fixture: PostgreSQL 15 on 127.0.0.1)

SEARCH = [
    "hparams_search=optuna",
    "model=mlp",
    *[t for t in TINY if not t.startswith("trainer.max_epochs")],
    "trainer.max_epochs=2",
    "hydra.sweeper.sampler.name=random",
    # A dead sweep's trial is stale 4 s after its last heartbeat (two heartbeats plus storage_outage_s).
    "hydra.sweeper.heartbeat_interval=1",
    "hydra.sweeper.storage_outage_s=2",
    "hydra.launcher.devices=1",
]
# A learning rate of 1e-7 cannot learn in 2 epochs: the median pruner stops it after its first. (A
# search parameter on the command line replaces the one of hydra.sweeper.params.)
TINY_LR_SPACE = "optimizer.lr=tag(log, interval(1e-8, 1e-1))"
ENQUEUED = '["optimizer.lr=0.01 data.batch_size=32","optimizer.lr=1e-7 data.batch_size=32"]'


def env_for(log_dir: Path, **extra: str) -> dict[str, str]:
    return {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(log_dir), "OMP_NUM_THREADS": "1", **extra}


def wait_for(predicate, what: str, timeout: float = 180, process=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the sweep ended ({process.returncode}) before {what}:\n{process.stdout.read()[-3000:]}"
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def the_study(log_dir: Path) -> optuna.Study:
    (db,) = (log_dir / "train" / "runs" / "optuna").glob("*.db")
    return optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")


@pytest.mark.slow
def test_a_killed_search_continues_with_the_same_command_and_a_hopeless_trial_is_pruned(tmp_path):
    log_dir, hold = tmp_path / "logs", tmp_path / "hold"
    command = [
        *SEARCH,
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.pruning.startup_trials=1",
        TINY_LR_SPACE,
        f"hydra.sweeper.enqueue={ENQUEUED}",
        "+callbacks.hold._target_=tests.faults.HoldWhileFileExists",
    ]
    env = env_for(log_dir, LITLAB_TEST_HOLD_FILE=str(hold))
    first = start_litlab("litlab-train", *command, env=env, new_session=True)
    try:
        # Trial 0 completes; trial 1 (the tiny lr) is caught after its first step, and the sweep is
        # killed outright: trial 1 stays RUNNING in the study, its heartbeat silent.
        wait_for(lambda: list(log_dir.glob("train/multiruns/*/0/summary.json")), "trial 0", process=first)
        hold.touch()
        wait_for(Path(f"{hold}.held").exists, "trial 1 to hold mid-training", process=first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    (killed_sweep,) = log_dir.glob("train/multiruns/*")
    killed_job = killed_sweep / "1"
    # The job's process learns of its sweep's death (SIGTERM) and stops at a checkpoint.
    wait_for(lambda: (killed_job / "summary.json").exists(), "the orphaned trial to stop", timeout=120)
    assert json.loads((killed_job / "summary.json").read_text())["status"] == "interrupted"
    hold.unlink()
    assert [t.state for t in the_study(log_dir).trials] == [TrialState.COMPLETE, TrialState.RUNNING]
    # Its record has the trial it was killed in (it used to lose it): interrupted, not missing.
    assert [row["status"] for row in build_report(collect_runs([killed_sweep])).rows] == [
        "completed",
        "interrupted",
    ]

    result = litlab("litlab-train", *command, env=env, timeout=480)
    ok(result)  # a pruned trial is not a failure
    sweeps = sorted(log_dir.glob("train/multiruns/*"))
    second = next(s for s in sweeps if s != killed_sweep)
    trials = the_study(log_dir).trials
    # The dead sweep's trial failed and was retried with its parameters: n_trials=2 spent in all.
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED]
    assert trials[2].params == trials[1].params and trials[1].params["optimizer.lr"] == pytest.approx(1e-7)
    assert trials[2].system_attrs["failed_trial"] == 1
    # The retry resumed the killed run (same overrides, same run identity) and was pruned early.
    pruned = json.loads((second / "0" / "summary.json").read_text())
    assert pruned["status"] == "pruned" and pruned["pruned_epoch"] == 0 and pruned["epochs"] < 2
    assert pruned["resumed_count"] == 1
    assert trials[2].user_attrs["job_dir"] == str(second / "0")
    assert not (second / "1").exists()  # nothing more was run
    best = OmegaConf.load(second / "best_trial.yaml")
    assert best.trial == 0 and best.value == pytest.approx(trials[0].value)
    assert {"optimizer.lr=0.01", "data.batch_size=32"} <= set(best.command.split())
    assert best.command.startswith("litlab-train model=mlp") and "hparams_search" not in best.command


@pytest.mark.slow
def test_two_sweeps_on_one_postgresql_study_share_n_trials(tmp_path, postgres_server):  # noqa: F811
    command = [*SEARCH, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={postgres_server.url}"]
    workers = [
        start_litlab("litlab-train", *command, env=env_for(tmp_path / f"machine{i}"), new_session=True)
        for i in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            out, _ = worker.communicate(timeout=480)
            outputs.append(out)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for worker, out in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, out[-3000:]
    # One study (the same command on both machines), n_trials in all, each trial run once.
    names = {
        line.split("Optuna study ")[1].split()[0]
        for out in outputs
        for line in out.splitlines()
        if "Optuna study " in line
    }
    assert len(names) == 1, names
    study = optuna.load_study(study_name=names.pop(), storage=storage_url(postgres_server.url, "", ""))
    used = [t for t in study.trials if not t.user_attrs.get("litlab_unused")]
    assert [t.state for t in used] == [TrialState.COMPLETE] * 2
    job_dirs = [Path(t.user_attrs["job_dir"]) for t in used]
    ran = sorted(d for i in range(2) for d in (tmp_path / f"machine{i}").glob("train/multiruns/*/[0-9]*"))
    assert sorted(job_dirs) == ran  # every job folder is one trial, and every trial has one
    assert {d.parents[3].name for d in job_dirs} == {"machine0", "machine1"}  # both pools were fed
    for job_dir, trial in zip(job_dirs, used, strict=True):
        summary = json.loads((job_dir / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert summary["metrics"]["val/acc"] == pytest.approx(trial.value)
        assert f"optimizer.lr={trial.params['optimizer.lr']!r}" in summary["overrides"]
    assert len({t.params["optimizer.lr"] for t in used}) == 2  # distinct trials
    for i in range(2):
        (sweep_dir,) = (tmp_path / f"machine{i}").glob("train/multiruns/*")
        assert OmegaConf.load(sweep_dir / "best_trial.yaml").value == pytest.approx(study.best_value)
    assert not list(tmp_path.rglob("*.db"))  # no SQLite study beside the PostgreSQL one
