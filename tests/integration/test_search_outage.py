"""An Optuna search whose PostgreSQL database goes away (issue 33, finding 3): real ``litlab-train
hparams_search=optuna`` sweeps on the device pool and a real PostgreSQL 15 server, stopped mid-search
and started again (a restart, a failover) or left down.

A short outage is waited out: every trial is told once, and a trial's pruning report that fails
warns once while the trial trains on. A longer one (past ``hydra.sweeper.storage_outage_s``) stops
the running trial at a checkpoint and ends the sweep in one line naming the database; the same
command, once the database is back, completes the study from that checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from litlab.launch.search import storage_url
from tests.conftest import litlab, logged, ok, start_litlab
from tests.integration.test_search import SEARCH, env_for, wait_for
from tests.postgres_server import postgres_server  # noqa: F401  (a fixture: PostgreSQL 15 on 127.0.0.1)

HOLD = "+callbacks.hold._target_=tests.faults.HoldWhileFileExists"
# The server trusts local connections: this password is never checked, and must never be shown.
PASSWORD = "s3cret-pw"


def search_command(server, outage_s: int, n_trials: int) -> list[str]:
    url = server.url.replace("litlab@", f"litlab:{PASSWORD}@")
    return [
        *(o for o in SEARCH if not o.startswith("hydra.sweeper.storage_outage_s=")),
        f"hydra.sweeper.n_trials={n_trials}",
        f"hydra.sweeper.storage={url}",
        f"hydra.sweeper.storage_outage_s={outage_s}",
        HOLD,
    ]


@contextlib.contextmanager
def database_stopped_mid_trial(tmp_path: Path, server, outage_s: int, n_trials: int, **start):
    """A search started with trial 0 held mid-training (``HOLD``), then the database stopped; yields
    the sweep's process, the log folder, the hold file and what the same command needs again."""
    log_dir, hold = tmp_path / "logs", tmp_path / "hold"
    hold.touch()
    env = env_for(log_dir, LITLAB_TEST_HOLD_FILE=str(hold))
    command = search_command(server, outage_s, n_trials=n_trials)
    sweep = start_litlab("litlab-train", *command, env=env, new_session=True, **start)
    try:
        wait_for(Path(f"{hold}.held").exists, "trial 0 to hold mid-training", process=sweep)
        server.stop()
        yield sweep, log_dir, hold, (command, env)
    finally:
        if sweep.poll() is None:
            sweep.kill()


def the_study(server) -> optuna.Study:
    url = storage_url(server.url, "", "")
    (summary,) = optuna.get_all_study_summaries(storage=url)
    return optuna.load_study(study_name=summary.study_name, storage=url)


def job_summary(job_dir: Path) -> dict:
    return json.loads((job_dir / "summary.json").read_text())


@pytest.mark.slow
def test_a_database_restarted_mid_search_is_waited_for_and_every_trial_is_told_once(
    tmp_path,
    postgres_server,  # noqa: F811
):
    with database_stopped_mid_trial(tmp_path, postgres_server, 60, n_trials=2) as (sweep, log_dir, hold, _):
        hold.unlink()
        # Trial 0 trains on while the database is down: its pruning reports fail, it completes,
        # and the sweep's tell of it fails too, and is tried again.
        (job,) = wait_for(lambda: list(log_dir.glob("train/multiruns/*/0/summary.json")), "trial 0")
        time.sleep(3)
        postgres_server.start()
        out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "StorageInternalError" not in out, out[-3000:]
    assert "does not answer" in out and "answers again" in out
    study = the_study(postgres_server)
    # Two trials, each told once: none failed, none retried, none told twice.
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        summary = job_summary(Path(trial.user_attrs["job_dir"]))
        assert summary["status"] == "completed"
        assert summary["metrics"]["val/acc"] == pytest.approx(trial.value)
    # The trial's pruning reports failed at both validations: one warning, and it trained on.
    assert len(logged(job.parent, "not reported", "WARNING")) == 1
    assert job_summary(job.parent)["epochs"] == 2
    assert PASSWORD not in out


@pytest.mark.slow
def test_a_database_that_stays_down_stops_the_search_in_one_line_and_the_same_command_completes_it(
    tmp_path,
    postgres_server,  # noqa: F811
):
    stopped = database_stopped_mid_trial(tmp_path, postgres_server, 4, n_trials=1, merge_stderr=False)
    with stopped as (sweep, log_dir, hold, (command, env)):
        out, err = sweep.communicate(timeout=90)
    assert sweep.returncode == 1, (out + err)[-3000:]
    assert "Traceback" not in out + err, (out + err)[-3000:]
    errors = [line for line in (out + err).splitlines() if line.startswith("litlab: error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err[-3000:]
    assert f"127.0.0.1:{postgres_server.port}" in errors[0] and "run the same command" in errors[0]
    assert PASSWORD not in out + err
    # The running trial was stopped as a preempted run is: at a checkpoint.
    (job,) = log_dir.glob("train/multiruns/*/0")
    assert job_summary(job)["status"] == "interrupted"
    assert list(log_dir.glob("train/runs/**/checkpoints/preempted.ckpt"))

    hold.unlink()
    postgres_server.start()
    ok(litlab("litlab-train", *command, env=env, timeout=300))
    trials = the_study(postgres_server).trials
    # The stopped trial went stale, was failed and retried with its parameters, from its checkpoint.
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials[1]
    assert retry.system_attrs["failed_trial"] == 0 and retry.params == trials[0].params
    resumed = job_summary(Path(retry.user_attrs["job_dir"]))
    assert resumed["status"] == "completed" and resumed["resumed_count"] == 1
