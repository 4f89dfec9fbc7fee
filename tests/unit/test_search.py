"""litlab's Optuna search (``litlab.launch.search``), in-process: the search space in Hydra's syntax, the
study's name and storage, the n_trials budget, and whole searches on a real SQLite study driven through
a launcher with ``run_queue`` whose jobs are plain functions (the real pool and real trials are in
tests/integration/test_search.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from litlab.config.redact import redact_text
from litlab.config.rules import ConfigError
from litlab.launch import search
from litlab.launch.multirun import JobPlan
from litlab.launch.search import (
    TRIAL_ENV,
    UNUSED_ATTR,
    OptunaSearch,
    budget_of,
    search_space,
    storage_url,
    study_name_of,
)
from litlab.report.render import report_runs
from litlab.run import sweep_record
from tests.conftest import TINY, compose_train, logged, train_in_process

SPACE = {"optimizer.lr": "tag(log, interval(1e-4, 1e-1))", "data.batch_size": "choice(16, 32, 64)"}


def distribution(line: str):
    (override,) = OverridesParser.create().parse_overrides([line])
    return search.distribution_of(override)


def test_sweep_syntax_becomes_optuna_distributions():
    assert distribution("a=interval(0.1, 0.5)") == FloatDistribution(0.1, 0.5)
    assert distribution("a=tag(log, interval(1e-4, 1e-1))") == FloatDistribution(1e-4, 1e-1, log=True)
    assert distribution("a=tag(int, interval(1, 8))") == IntDistribution(1, 8)
    assert distribution("a=tag(int, log, interval(1, 64))") == IntDistribution(1, 64, log=True)
    # range() excludes its stop, as Hydra's basic sweeper does: 1, 3, 5, 7, 9.
    assert distribution("a=range(1, 10, 2)") == IntDistribution(1, 9, step=2)
    assert distribution("a=choice(16, 32, mlp)") == CategoricalDistribution([16, 32, "mlp"])
    assert distribution("a=1,2") == CategoricalDistribution([1, 2])
    for bad in ("a=interval(2, 1)", "a=tag(log, interval(0, 1))", "a=tag(cube, interval(1, 2))"):
        with pytest.raises(ConfigError, match="a"):
            distribution(bad)


def test_the_command_line_adds_to_and_replaces_the_search_params():
    space = search_space(SPACE, ["model=mlp", "optimizer.lr=interval(0.01, 0.02)", "data.batch_size=8"])
    assert space.distributions == {"optimizer.lr": FloatDistribution(0.01, 0.02)}
    # Fixed overrides stay exactly as typed (never resolved values: issue 23's secrets).
    assert sorted(space.fixed) == ["data.batch_size=8", "model=mlp"]
    assert search.trial_overrides({"optimizer.lr": 0.012345678901234, "model": "mlp", "f": True}) == [
        "optimizer.lr=0.012345678901234",
        "model=mlp",
        "f=true",
    ]


def test_enqueued_trials_are_lines_of_overrides():
    assert search.parse_enqueued(["optimizer.lr=0.01 data.batch_size=32", "optimizer.lr=1e-7"]) == [
        {"optimizer.lr": 0.01, "data.batch_size": 32},
        {"optimizer.lr": 1e-7},
    ]
    with pytest.raises(ConfigError, match="enqueue"):
        search.parse_enqueued(["optimizer.lr=1,2"])


def test_the_study_is_named_after_the_command():
    space = search_space(SPACE, [])
    name = study_name_of("default", ["hparams_search=optuna", "model=mlp", "seed=1"], space, "maximize")
    assert name.startswith("default-")
    # Order, and where runs go (storage, paths, resume), do not make another study.
    assert name == study_name_of(
        "default",
        ["seed=1", "model=mlp", "hparams_search=optuna", "storage.root=/x", "resume=never"],
        space,
        "maximize",
    )
    # What the runs are, the space and the direction do.
    others = {
        study_name_of("default", ["hparams_search=optuna", "model=cnn", "seed=1"], space, "maximize"),
        study_name_of("default", ["hparams_search=optuna", "model=mlp", "seed=1"], space, "minimize"),
        study_name_of(
            "default",
            ["hparams_search=optuna", "model=mlp", "seed=1"],
            search_space({**SPACE, "x": "1,2"}, []),
            "maximize",
        ),
        study_name_of("other", ["hparams_search=optuna", "model=mlp", "seed=1"], space, "maximize"),
    }
    assert name not in others and len(others) == 4


def test_storage_urls(tmp_path):
    url = storage_url(None, str(tmp_path / "storage"), "default-abc")
    assert url == f"sqlite:///{tmp_path}/storage/optuna/default-abc.db"
    assert (tmp_path / "storage" / "optuna").is_dir()
    assert storage_url("postgresql://u@h:5432/db", "", "s") == "postgresql+psycopg://u@h:5432/db"
    assert storage_url("postgres://u@h/db", "", "s") == "postgresql+psycopg://u@h/db"
    assert storage_url("postgresql+psycopg2://u@h/db", "", "s") == "postgresql+psycopg2://u@h/db"
    with pytest.raises(ConfigError, match="storage.root=s3://bucket/runs is not on this machine"):
        storage_url(None, "s3://bucket/runs", "s")
    with pytest.raises(ConfigError, match="hydra.sweeper.storage=mydb: not a database URL"):
        storage_url("mydb", "", "s")
    # Shown and written as litlab redacts any URL (config.redact): no user-info, so no password.
    assert redact_text("postgresql+psycopg://me:s3cret@db:5432/x") == "postgresql+psycopg://***@db:5432/x"
    assert redact_text("sqlite:////a/b.db") == "sqlite:////a/b.db"


def frozen(number: int, state: TrialState, **system_attrs):
    trial = create_trial(
        state=state,
        value=1.0 if state == TrialState.COMPLETE else None,
        intermediate_values={0: 0.1} if state == TrialState.PRUNED else None,
        system_attrs=system_attrs,
    )
    trial.number = number
    return trial


def test_n_trials_counts_completed_pruned_and_failed_trials_that_are_not_retried():
    trials = [
        frozen(0, TrialState.COMPLETE),
        frozen(1, TrialState.PRUNED),
        frozen(2, TrialState.FAIL),  # a stale trial: retried by 5
        frozen(3, TrialState.FAIL),  # a bad sample: spent
        frozen(4, TrialState.RUNNING),
        frozen(5, TrialState.WAITING, failed_trial=2, retry_history=[2]),
    ]
    unused = frozen(6, TrialState.FAIL)
    unused.user_attrs[UNUSED_ATTR] = True
    budget = budget_of([*trials, unused])
    assert (budget.spent, budget.running) == (3, 1)  # the waiting retry (5) is neither
    assert budget.can_ask(5) and not budget.can_ask(4) and not budget.done(4) and budget.done(3)
    # Two workers asked at once (7 and 8) for the last place of n_trials=5: the lower number keeps it.
    both = [*trials, frozen(7, TrialState.RUNNING), frozen(8, TrialState.RUNNING)]
    assert budget_of(both, below=7).can_ask(5) and not budget_of(both, below=8).can_ask(5)


# --- whole searches, in-process ------------------------------------------------------------------


def record(sweep_dir: Path, job_idx: int, summary: dict, overrides: list[str]) -> None:
    """What a launcher leaves for the sweeper: the job's entry in the sweep's record (and summary.json)."""
    (sweep_dir / str(job_idx) / "summary.json").write_text(json.dumps(summary))
    run_dir = sweep_dir / str(job_idx)
    sweep_record.write_job(
        sweep_dir, job_idx, sweep_record.TRAINED, summary, run_dir=run_dir, overrides=overrides
    )


class FunctionPool:
    """A launcher with ``run_queue`` whose jobs are a function of their overrides: it asks for up to
    ``slots`` jobs, then ends them one at a time (oldest first), writing each job's summary.json."""

    def __init__(self, sweep_dir: Path, job, slots: int = 2) -> None:
        self.sweep_dir, self.job, self.slots = sweep_dir, job, slots
        self.started: list[tuple[int, list[str], dict]] = []
        self.next_idx = 0

    def run_queue(self, next_job, on_done, first_index: int = 0) -> None:
        assert first_index == self.next_idx  # job folders never repeat within a sweep
        running: list[tuple[int, object]] = []
        exhausted = False
        while True:
            while not exhausted and len(running) < self.slots:
                queued = next_job(self.next_idx)
                if queued is None:
                    exhausted = True
                    break
                running.append((self.next_idx, queued))
                self.started.append((self.next_idx, list(queued.overrides), dict(queued.env)))
                self.next_idx += 1
            if not running:
                return
            idx, queued = running.pop(0)
            job_dir = self.sweep_dir / str(idx)
            job_dir.mkdir(parents=True, exist_ok=True)
            summary = self.job(
                dict(o.split("=", 1) for o in queued.overrides), json.loads(queued.env[TRIAL_ENV])
            )
            record(self.sweep_dir, idx, summary, queued.overrides)
            result = JobReturn(working_dir=str(job_dir), status=JobStatus.COMPLETED)
            result.return_value = (summary.get("metrics") or {}).get("val/acc")
            on_done(idx, result)


def searcher(
    tmp_path: Path, sweep: str, job, slots: int = 2, **settings
) -> tuple[OptunaSearch, FunctionPool]:
    cfg = OmegaConf.create(
        {
            "experiment_name": "default",
            "optimized_metric": "val/acc",
            "storage": {"root": str(tmp_path / "storage")},
            "trainer": {"max_epochs": 3},
            "hydra": {"sweep": {"dir": str(tmp_path / sweep)}},
        }
    )
    settings = {"params": SPACE, "n_trials": 4, "sampler": {"name": "random", "seed": 0}, **settings}
    sweeper = OptunaSearch(**settings)
    # No Hydra config loader here: the trials' plans record nothing.
    sweeper.check_composes = lambda overrides: JobPlan(0, overrides, tmp_path, None, None)
    sweeper.config = cfg
    sweeper.launcher = FunctionPool(tmp_path / sweep, job, slots)
    return sweeper, sweeper.launcher


def completed(params, trial):
    return {"status": "completed", "metrics": {"val/acc": float(params["optimizer.lr"])}}


def load(tmp_path: Path) -> optuna.Study:
    (db,) = (tmp_path / "storage" / "optuna").glob("*.db")
    return optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")


def test_a_search_runs_n_trials_and_the_same_command_continues_it(tmp_path):
    sweeper, pool = searcher(tmp_path, "sweep1", completed)
    sweeper.sweep(["model=mlp"])
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    # Each job got its trial's parameters as overrides, the fixed ones as typed, and its trial.
    for (idx, overrides, env), trial in zip(pool.started, study.trials, strict=True):
        assert overrides[0] == "model=mlp"
        assert overrides[1:] == search.trial_overrides(trial.params)
        spec = json.loads(env[TRIAL_ENV])
        assert spec["trial"] == trial.number and spec["study"] == study.study_name
        assert trial.user_attrs["job_dir"] == str(tmp_path / "sweep1" / str(idx))
        assert set(trial.user_attrs) == {"job_dir", "host"}  # no overrides, no config values
    best = OmegaConf.load(tmp_path / "sweep1" / "best_trial.yaml")
    assert best.value == study.best_value and best.trial == study.best_trial.number
    assert best.command == "litlab-train model=mlp " + " ".join(
        search.trial_overrides(study.best_trial.params)
    )
    # The same command again: the study is complete, nothing runs.
    again, pool_again = searcher(tmp_path, "sweep2", completed)
    again.sweep(["model=mlp"])
    assert pool_again.started == [] and len(load(tmp_path).trials) == 4
    # A larger n_trials continues the same study.
    more, pool_more = searcher(tmp_path, "sweep3", completed, n_trials=6)
    more.sweep(["model=mlp"])
    assert len(pool_more.started) == 2 and len(load(tmp_path).trials) == 6


def test_a_study_complete_before_the_sweep_still_gets_its_report_and_says_how_to_go_on(tmp_path, caplog):
    first, _ = searcher(tmp_path, "sweep1", completed, n_trials=2)
    first.sweep(["model=mlp"])
    # Another pruner or launcher is not another study: the same command finds it complete.
    again, pool = searcher(tmp_path, "sweep2", completed, n_trials=2, pruner="none")
    with caplog.at_level("WARNING", logger="litlab.launch.search"):
        again.sweep(["model=mlp"])
    assert pool.started == []
    (line,) = [r.getMessage() for r in caplog.records if "nothing is left to run" in r.getMessage()]
    assert "already has its 2 trials (2 spent)" in line
    assert "hydra.sweeper.n_trials=4" in line and "hydra.sweeper.study_name=" in line
    entries, _ = sweep_record.read(tmp_path / "sweep2")
    study = load(tmp_path)
    assert [e["outcome"] for e in entries] == ["skipped", "skipped"]
    assert [e["summary"]["metrics"]["val/acc"] for e in entries] == [t.value for t in study.trials]
    assert all(f"of study {study.study_name}" in e["note"] for e in entries)
    report = report_runs([tmp_path / "sweep2"], tmp_path / "sweep2")
    assert report.run_count == 2
    best = OmegaConf.load(tmp_path / "sweep2" / "best_trial.yaml")
    assert best.value == study.best_value


def test_a_fixed_run_name_in_a_search_is_refused_before_any_trial(tmp_path, capsys):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import HydraContext, RunMode

    from litlab.config import resolvers, schema
    from litlab.config.preflight import CONFIG_DIR

    schema.register()
    resolvers.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    arguments = ["hparams_search=optuna", "run_name=mine"]
    cfg = loader.load_configuration("train", arguments, run_mode=RunMode.MULTIRUN)
    sweeper, pool = searcher(tmp_path, "sweep", completed)
    del sweeper.check_composes  # composed with the real config loader
    sweeper.hydra_context, sweeper.config = HydraContext(config_loader=loader, callbacks=None), cfg
    with pytest.raises(SystemExit) as stopped:
        sweeper.sweep(arguments)
    assert stopped.value.code == 2 and pool.started == []
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("litlab: error: jobs #0 (") and "would share the run name mine" in error


def test_each_trial_is_in_the_sweeps_record_from_the_moment_it_is_asked_for(tmp_path, log_dir):
    """A search killed with trial 2 running lost it: the record had an entry only when a job ended."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import HydraContext, RunMode

    from litlab.config import resolvers, schema
    from litlab.config.preflight import CONFIG_DIR

    schema.register()
    resolvers.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    sweep_dir = tmp_path / "sweep"
    arguments = ["hparams_search=optuna", "model=mlp"]
    cfg = loader.load_configuration(
        "train", [*arguments, f"hydra.sweep.dir={sweep_dir}"], run_mode=RunMode.MULTIRUN
    )
    recorded_as_it_ran = []

    def job(params, trial):  # while the trial runs: the record has it, planned
        entries = sweep_record.read(sweep_dir)[0]
        lr = f"optimizer.lr={params['optimizer.lr']}"
        recorded_as_it_ran.extend(e["outcome"] for e in entries if lr in e["overrides"])
        return completed(params, trial)

    sweeper, _ = searcher(tmp_path, "sweep", job, n_trials=2)
    del sweeper.check_composes  # composed with the real config loader
    sweeper.hydra_context, sweeper.config = HydraContext(config_loader=loader, callbacks=None), cfg
    sweeper.sweep(arguments)
    assert recorded_as_it_ran == ["planned", "planned"]


def test_pruned_failed_and_interrupted_trials(tmp_path):
    outcomes = iter(["pruned", "failed", "interrupted", "completed", "completed", "completed"])

    def job(params, trial):
        status = next(outcomes)
        metrics = {"val/acc": 0.5} if status == "completed" else {}
        return {"status": status, "metrics": metrics, "pruned_epoch": 0 if status == "pruned" else None}

    sweeper, pool = searcher(tmp_path, "sweep", job, slots=1)
    sweeper.sweep([])
    states = [t.state for t in load(tmp_path).trials]
    # The interrupted trial (2) is retried with its parameters (3): it would resume from its checkpoint.
    assert states == [TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL] + [TrialState.COMPLETE] * 2
    trials = load(tmp_path).trials
    assert trials[3].params == trials[2].params
    assert budget_of(trials).spent == 4 and len(pool.started) == 5


def test_an_interrupted_trial_is_retried_at_most_max_retry_times(tmp_path):
    outcomes = iter(["interrupted", "completed", "completed"])

    def job(params, trial):
        status = next(outcomes)
        return {"status": status, "metrics": {"val/acc": 0.5} if status == "completed" else {}}

    sweeper, _ = searcher(tmp_path, "sweep", job, slots=1, n_trials=2, max_retry=0)
    sweeper.sweep([])
    trials = load(tmp_path).trials
    # Not retried, the interrupted trial counts in n_trials as a failed one.
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert not any("failed_trial" in t.system_attrs for t in trials), "max_retry=0: no retry"


# A trial is stale once silent for two heartbeats plus storage_outage_s: 3 s here.
QUICK = {"heartbeat_interval": 1, "storage_outage_s": 1}


def a_trial_left_running(tmp_path: Path, monkeypatch, job_dir: Path | None = None) -> None:
    """A study of two completed trials and a third that a sweep asked for, gave one heartbeat and then
    left (it died, or the database was down when it ended); its job folder ``job_dir``."""
    monkeypatch.setattr(search, "WAIT_FOR_OTHERS_S", 0.2)
    sweeper, _ = searcher(tmp_path, "sweep1", completed, n_trials=2, **QUICK)
    sweeper.sweep([])
    study = load(tmp_path)
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/storage/optuna/{study.study_name}.db", heartbeat_interval=1
    )
    left = optuna.load_study(study_name=study.study_name, storage=storage).ask(
        {"optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True)}
    )
    if job_dir is not None:
        left.set_user_attr("job_dir", str(job_dir))
    storage.record_heartbeat(left._trial_id)


def test_a_dead_sweeps_running_trial_is_failed_and_retried(tmp_path, monkeypatch):
    a_trial_left_running(tmp_path, monkeypatch)
    rerun, pool = searcher(tmp_path, "sweep2", completed, n_trials=3, **QUICK)
    started = time.monotonic()
    rerun.sweep([])
    trials = load(tmp_path).trials
    assert time.monotonic() - started < 30
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL, TrialState.COMPLETE]
    # The retry has the dead trial's parameters (and samples those it had not asked for yet).
    assert trials[3].params["optimizer.lr"] == trials[2].params["optimizer.lr"] and len(pool.started) == 1
    assert budget_of(trials).spent == 3


def test_a_trial_that_completed_while_the_database_was_down_is_told_from_its_summary_not_trained_again(
    tmp_path, monkeypatch
):
    """Issue 40: a trial completed during an outage but was never told; it went stale, and its retry
    trained from scratch on the other worker (separate log folders), losing the value 0.775."""
    job_dir = tmp_path / "other_worker_logs" / "multiruns" / "0"  # another worker's log folder
    job_dir.mkdir(parents=True)
    (job_dir / "summary.json").write_text(json.dumps({"status": "completed", "metrics": {"val/acc": 0.775}}))
    a_trial_left_running(tmp_path, monkeypatch, job_dir)  # the database came back too late to tell it
    rerun, pool = searcher(tmp_path, "sweep2", completed, n_trials=3, **QUICK)
    rerun.sweep([])
    trials = load(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[3].value == 0.775 and trials[3].params["optimizer.lr"] == trials[2].params["optimizer.lr"]
    assert pool.started == [] and trials[3].user_attrs["job_dir"] == str(job_dir)  # not trained again


def test_an_optuna_search_composes_with_litlabs_sweeper(tmp_path):
    cfg = compose_train(["hparams_search=optuna"], tmp_path)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.litlab_search.OptunaSearch"
    assert sweeper.storage is None and sweeper.pruner == "median" and sweeper.n_trials == 20
    assert sweeper.sampler.seed == cfg.seed
    from hydra.core.plugins import Plugins

    assert Plugins.instance().class_name_to_class["hydra_plugins.litlab_search.OptunaSearch"]


def test_a_choice_that_does_not_compose_stops_the_search_before_any_trial(tmp_path, capsys):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import HydraContext, RunMode

    from litlab.config.preflight import CONFIG_DIR

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    cfg = loader.load_configuration("train", ["hparams_search=optuna"], run_mode=RunMode.MULTIRUN)
    sweeper, pool = searcher(tmp_path, "sweep", completed)
    del sweeper.check_composes  # composed with the real config loader
    sweeper.hydra_context, sweeper.config = HydraContext(config_loader=loader, callbacks=None), cfg
    with pytest.raises(SystemExit) as stopped:
        sweeper.sweep(["model=choice(mlp,nosuch)"])
    assert stopped.value.code == 2 and pool.started == []
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        error.startswith("litlab: error: the search's overrides") and "model=nosuch do not compose" in error
    )


# Each value composes and passes alone, and so do the space's two ends (96/2, 100/5); 96/5 does not divide.
BATCH_SPACE = {"global_batch_size": "choice(96, 100)", "trainer.accumulate_grad_batches": "choice(2, 5)"}
NOT_DIVIDING = "global_batch_size=96 trainer.accumulate_grad_batches=5"


def real_searcher(tmp_path: Path, launcher, **settings) -> OptunaSearch:
    """A search of BATCH_SPACE on the real config loader whose first trial's batch does not divide."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import HydraContext, RunMode

    from litlab.config import resolvers, schema
    from litlab.config.preflight import CONFIG_DIR

    schema.register()
    resolvers.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    arguments = [
        "hparams_search=optuna",
        f"hydra.sweep.dir={tmp_path}/sweep",
        f"storage.root={tmp_path}/storage",
    ]
    cfg = loader.load_configuration("train", arguments, run_mode=RunMode.MULTIRUN)
    settings = {"enqueue": [NOT_DIVIDING], **settings}
    sweeper, _ = searcher(tmp_path, "sweep", completed, params=BATCH_SPACE, **settings)
    del sweeper.check_composes  # composed with the real config loader
    sweeper.hydra_context, sweeper.config = HydraContext(config_loader=loader, callbacks=None), cfg
    if launcher is not None:
        launcher.setup(hydra_context=sweeper.hydra_context, task_function=None, config=cfg)
        sweeper.launcher = launcher
    return sweeper


def test_a_trial_whose_batch_does_not_divide_is_a_failed_row_and_the_search_goes_on(tmp_path):
    """A sampled point that fails a rule (the space's ends and every choice passed before the first
    trial) used to end the whole search with exit 2, even after days of trials: now its job is not
    started, with the single run's one line, the trial failed, and the search goes on."""
    from litlab.launch.pool import DevicePoolLauncher

    sweeper = real_searcher(tmp_path, DevicePoolLauncher(), n_trials=1)
    sweeper.sweep([])
    (trial,) = load(tmp_path).trials
    assert trial.state == TrialState.FAIL
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert entry["outcome"] == sweep_record.NOT_STARTED and entry["summary"]["status"] == "failed"
    assert entry["summary"]["error"].startswith("global_batch_size=96 does not divide")
    assert trial.user_attrs["job_dir"] == entry["run_dir"]


def test_under_a_launcher_without_a_queue_a_trial_that_fails_a_rule_is_never_launched(tmp_path):
    dividing = [
        "global_batch_size=100 trainer.accumulate_grad_batches=5",
        "global_batch_size=96 trainer.accumulate_grad_batches=2",
    ]
    sweeper = real_searcher(tmp_path, None, n_trials=3, n_jobs=2, enqueue=[NOT_DIVIDING, *dividing])
    sweeper.launcher = FunctionLauncher(tmp_path / "sweep")
    sweeper.sweep(["optimizer.lr=0.01"])  # FunctionLauncher's jobs return it
    trials = load(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    # Trial 0 ends its batch before it: the launched jobs are the two after it, as one batch.
    assert [len(batch) for batch in sweeper.launcher.batches] == [2]
    entries, _ = sweep_record.read(tmp_path / "sweep")
    (refused,) = [e for e in entries if e["outcome"] == sweep_record.NOT_STARTED]
    assert refused["job_num"] == 0 and "does not divide" in refused["summary"]["error"]
    assert json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())["status"] == "failed"


def test_a_database_that_stops_answering_for_less_than_storage_outage_s_is_waited_for(
    tmp_path, monkeypatch, caplog
):
    import sqlalchemy.exc

    down_until = [0.0]
    tell = optuna.storages.RDBStorage.set_trial_state_values

    def tell_while_up(storage, *args, **kwargs):  # what Optuna raises for a lost connection
        if time.monotonic() < down_until[0]:
            refused = sqlalchemy.exc.OperationalError("COMMIT", {}, ConnectionRefusedError("refused"))
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit."
            ) from refused
        return tell(storage, *args, **kwargs)

    def job(params, trial):  # the database goes down as the first trial ends, for 2.5 s
        if trial["trial"] == 0:
            down_until[0] = time.monotonic() + 2.5
        return completed(params, trial)

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", tell_while_up)
    sweeper, pool = searcher(tmp_path, "sweep", job, slots=1, storage_outage_s=30)
    with caplog.at_level("INFO", logger="litlab.launch.search"):
        sweeper.sweep([])
    # Every trial told once: none failed, none retried, none lost.
    assert [t.state for t in load(tmp_path).trials] == [TrialState.COMPLETE] * 4 and len(pool.started) == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "does not answer (refused)" in warnings[0]
    assert len([r for r in caplog.records if "answers again" in r.getMessage()]) == 1


def test_an_outage_while_no_trial_runs_says_so_and_stops_no_trial(tmp_path, monkeypatch, capsys):
    """The database goes down for good as the only slot's trial ends: nothing was running, so the
    line must not say the sweep "stopped its running trials"."""
    import sqlalchemy.exc

    down = [False]
    tell = optuna.storages.RDBStorage.set_trial_state_values

    def tell_while_up(storage, *args, **kwargs):
        if down[0]:
            refused = sqlalchemy.exc.OperationalError("COMMIT", {}, ConnectionRefusedError("refused"))
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit."
            ) from refused
        return tell(storage, *args, **kwargs)

    def job(params, trial):
        down[0] = True
        return completed(params, trial)

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", tell_while_up)
    sweeper, pool = searcher(tmp_path, "sweep", job, slots=1, storage_outage_s=1)
    with pytest.raises(SystemExit) as ended:
        sweeper.sweep([])
    assert ended.value.code == 1 and len(pool.started) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "did not answer for 1 s" in line and "no trial was running" in line, line
    assert "stopped its running trials" not in line


class FunctionLauncher:
    """A launcher without ``run_queue`` (joblib, submitit): Hydra's ``launch`` of a batch of jobs."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.batches: list[list[list[str]]] = []

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        self.batches.append([list(o) for o in job_overrides])
        returns = []
        for offset, overrides in enumerate(job_overrides):
            job_dir = self.sweep_dir / str(initial_job_idx + offset)
            job_dir.mkdir(parents=True)
            params = dict(o.split("=", 1) for o in overrides if not o.startswith("++hydra."))
            record(self.sweep_dir, initial_job_idx + offset, completed(params, None), overrides)
            returns.append(JobReturn(working_dir=str(job_dir), status=JobStatus.COMPLETED))
        return returns


def test_launchers_without_a_queue_get_batches_of_n_jobs_trials(tmp_path):
    sweeper, _ = searcher(tmp_path, "sweep", completed, n_trials=5, n_jobs=2)
    sweeper.launcher = FunctionLauncher(tmp_path / "sweep")
    sweeper.sweep([])
    assert [len(batch) for batch in sweeper.launcher.batches] == [2, 2, 1]
    assert [t.state for t in load(tmp_path).trials] == [TrialState.COMPLETE] * 5
    # The trial reaches the job's process through Hydra's job.env_set (the launcher has no env).
    first = sweeper.launcher.batches[0][0][-1]
    assert first.startswith(f"++hydra.job.env_set.{TRIAL_ENV}=") and '"trial": 0' in first


# --- pruning inside a run (litlab.callbacks.pruning), in-process ---------------------------------


def trial_of_a_study_with_a_good_trial(tmp_path: Path) -> dict:
    """A SQLite study with one completed trial that reached val/acc 0.99 at epoch 0, and a new running
    trial: the LITLAB_OPTUNA_TRIAL of that trial (median pruner, prunes from the first trial on)."""
    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.add_trial(create_trial(value=0.99, intermediate_values={0: 0.99, 1: 0.99}))
    trial = study.ask()
    pruner = {"name": "median", "startup_trials": 1, "warmup_epochs": 0, "max_epochs": 2}
    return {"storage": url, "study": "s", "trial": trial.number, "pruner": pruner}


RUN = [*TINY, "model=mlp", "trainer.max_epochs=2", "optimizer.lr=1e-7"]


def test_a_trial_worse_than_the_median_stops_after_that_validation(tmp_path, monkeypatch):
    spec = trial_of_a_study_with_a_good_trial(tmp_path)
    monkeypatch.setenv(TRIAL_ENV, json.dumps(spec))
    summary = train_in_process(tmp_path, *RUN)
    assert summary["status"] == "pruned" and summary["pruned_epoch"] == 0
    assert summary["epochs"] == 1 and summary["checkpoints"]["tested"] is None  # stopped there, no test
    assert not any(name.startswith("test/") for name in summary["metrics"])
    trial = optuna.load_study(study_name="s", storage=spec["storage"]).trials[1]
    assert trial.intermediate_values == {0: pytest.approx(summary["metrics"]["val/acc"])}
    assert trial.state == TrialState.RUNNING  # the sweep tells it, when the job has ended


def test_a_study_out_of_reach_does_not_stop_the_run(tmp_path, monkeypatch):
    spec = {
        **trial_of_a_study_with_a_good_trial(tmp_path),
        "storage": f"sqlite:///{tmp_path}/no/such/dir/x.db",
    }
    monkeypatch.setenv(TRIAL_ENV, json.dumps(spec))
    summary = train_in_process(tmp_path, *RUN)
    assert summary["status"] == "completed" and summary["pruned_epoch"] is None and summary["epochs"] == 2
    assert logged(tmp_path / "run", "the run is not pruned")


def test_reports_that_fail_while_the_database_is_down_warn_once_and_the_trial_trains_on(
    tmp_path, monkeypatch
):
    spec = trial_of_a_study_with_a_good_trial(tmp_path)
    monkeypatch.setenv(TRIAL_ENV, json.dumps(spec))

    def database_down(trial, value, step):  # what Optuna raises for a lost connection
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.")

    monkeypatch.setattr(optuna.trial.Trial, "report", database_down)
    three_epochs = [*(o for o in RUN if not o.startswith("trainer.max_epochs")), "trainer.max_epochs=3"]
    summary = train_in_process(tmp_path, *three_epochs)
    assert summary["status"] == "completed" and summary["epochs"] == 3
    # Three reports failed: one warning.
    assert len(logged(tmp_path / "run", "Optuna trial", "WARNING")) == 1
