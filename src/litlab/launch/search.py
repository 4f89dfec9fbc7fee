"""litlab's Optuna search (``hparams_search=optuna``, through ``hydra_plugins.litlab_search``): a Hydra
sweeper on Optuna's ask-and-tell API that asks whenever the pool has a free slot, on a study the same
command continues. What it guarantees and how: docs/sweeps.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from hydra.core.utils import JobReturn
from omegaconf import OmegaConf

from litlab.config.identity import NOT_SETTINGS
from litlab.config.pruners import TRIAL_ENV, database_error, engine_kwargs, make_pruner, quiet_optuna
from litlab.config.redact import redact_text
from litlab.config.rules import ConfigError
from litlab.errors import EXIT_FAILED, LitlabError, error_chain, one_line
from litlab.launch.multirun import JobPlan, NotComposed, PlanningSweeper, distinct_runs, job_config, plan_job
from litlab.launch.pool import QueuedJob, not_started, task_config
from litlab.run import sweep_record
from litlab.run.summary import finite
from litlab.storage.roots import write_text_atomic

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

_BEST_TRIAL_FILE = "best_trial.yaml"
# A trial this worker asked for over the budget (another worker asked at the same moment) and gave back.
UNUSED_ATTR = "litlab_unused"
# Overrides that pick the search itself: not part of a trial's own command.
_SEARCH_ONLY = ("hparams_search=", "+hparams_search=")
# How often a worker whose remaining budget is held by other workers' trials looks again (seconds).
WAIT_FOR_OTHERS_S = 2.0


# --- the search space ----------------------------------------------------------------------------


def distribution_of(override: Override) -> Any:
    """The Optuna distribution of one sweep override in Hydra's syntax (``interval``, ``tag(log|int,
    ...)``, ``range``, ``shuffle(range(...))``, ``choice`` or ``a,b``: docs/sweeps.md)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    key = override.get_key_element()
    if isinstance(value, IntervalSweep):
        tags = set(value.tags)
        if unknown := tags - {"log", "int"}:
            raise ConfigError(f"{key}: interval tags are log and int, not {', '.join(sorted(unknown))}")
        if value.start >= value.end or ("log" in tags and value.start <= 0):
            raise ConfigError(
                f"{override.input_line}: an interval needs start < end"
                + (" and start > 0 on a log scale" if "log" in tags else "")
            )
        if "int" in tags:
            return IntDistribution(int(value.start), int(value.end), log="log" in tags)
        return FloatDistribution(float(value.start), float(value.end), log="log" in tags)
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator(transformer=Transformer.identity))
        if not values:
            raise ConfigError(f"{override.input_line}: the range is empty")
        if value.shuffle:
            return CategoricalDistribution(values)
        if all(isinstance(v, int) for v in values) and isinstance(value.step, int):
            return IntDistribution(values[0], values[-1], step=value.step)
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(value.step))
    if isinstance(value, ChoiceSweep):
        # Encoded as override values (quoted where Hydra needs it): written into the trial's command as is.
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    raise ConfigError(f"{override.input_line}: a search parameter is interval, range or choice")


@dataclass
class _SearchSpace:
    distributions: dict[str, Any]  # parameter name -> Optuna distribution
    fixed: list[str]  # the other overrides, as typed


def search_space(params: dict[str, str], arguments: Sequence[str]) -> _SearchSpace:
    """``hydra.sweeper.params`` and the command line's overrides: sweeps become distributions, the
    others stay fixed overrides; a parameter on the command line replaces the one of the params."""
    lines = [f"{key}={value}" for key, value in params.items()] + list(arguments)
    space = _SearchSpace({}, [])
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(lines):  # each checked, in the order given
        key = override.get_key_element()
        if override.is_sweep_override():
            fixed.pop(key, None)
            space.distributions[key] = distribution_of(override)
        else:
            space.distributions.pop(key, None)
            fixed[key] = override.input_line
    space.fixed = list(fixed.values())
    return space


def trial_overrides(params: dict[str, Any]) -> list[str]:
    """A trial's sampled parameters as overrides (choices are already encoded as Hydra values)."""
    return [f"{name}={_override_value(value)}" for name, value in params.items()]


def _override_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)  # every digit: the command reproduces the trial exactly
    return str(value)


def parse_enqueued(lines: Sequence[str]) -> list[dict[str, Any]]:
    """``hydra.sweeper.enqueue``: trials to try first, each a string of space-separated overrides
    (``"optimizer.lr=0.01 data.batch_size=32"``); parameters a line leaves out are sampled."""
    parser = OverridesParser.create()
    trials = []
    for line in lines:
        overrides = parser.parse_overrides(shlex.split(line))
        if any(o.is_sweep_override() for o in overrides):
            raise ConfigError(f"hydra.sweeper.enqueue: '{line}' gives one value per parameter, not a sweep")
        trials.append({o.get_key_element(): o.value() for o in overrides})
    return trials


# --- the study's name and storage ----------------------------------------------------------------


def study_name_of(experiment_name: str, arguments: Sequence[str], space: _SearchSpace, direction: str) -> str:
    """The experiment name plus a hash of what defines the search, so the same command continues the
    same study: the overrides that define the runs (as run settings take them), the space and the
    direction; not n_trials (raise it to extend a search), the storage, sampler, pruner or launcher."""
    keys = {a: re.split(r"[./=]", a.lstrip("+~"), maxsplit=1)[0] for a in arguments}
    overrides = sorted(a for a, key in keys.items() if key not in NOT_SETTINGS)
    space_text = [f"{name}: {dist!r}" for name, dist in sorted(space.distributions.items())]
    text = "\n".join([*overrides, "--", *space_text, "--", direction])
    return f"{experiment_name}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def storage_url(storage: str | None, storage_root: str, study_name: str) -> str:
    """The SQLAlchemy URL of the study's storage. ``None``: ``<storage.root>/optuna/<study>.db`` in
    SQLite, which needs a local storage root. ``postgresql://`` and ``postgres://`` use psycopg 3."""
    if storage is None:
        if urlsplit(storage_root).scheme not in ("", "file"):
            raise ConfigError(
                f"hydra.sweeper.storage=null keeps the study in a SQLite file under storage.root, but "
                f"storage.root={storage_root} is not on this machine's disk: set hydra.sweeper.storage "
                "to a database URL (postgresql://user@host/db) or a sqlite:////path/study.db"
            )
        folder = Path(storage_root.removeprefix("file://")).expanduser().resolve() / "optuna"
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{folder / study_name}.db"
    if "://" not in storage:
        raise ConfigError(
            f"hydra.sweeper.storage={storage}: not a database URL; use postgresql://user@host/db, "
            "sqlite:////path/study.db, or null (a SQLite file under storage.root)"
        )
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", storage)


def _open_storage(url: str, heartbeat_interval: int, max_retry: int, outage_s: float) -> Any:
    """The study's storage; a trial is stale after two silent heartbeats plus ``outage_s``, so a sweep
    that waits out an outage keeps its trials."""
    import random

    import optuna
    import sqlalchemy.exc

    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs(url),
                heartbeat_interval=heartbeat_interval,
                grace_period=int(2 * heartbeat_interval + outage_s),
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=max_retry
                ),
            )
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Workers started at once race to create a new database's tables: the losers' CREATE fails.
            if attempt == 5:
                raise
            time.sleep(random.uniform(0.2, 1.0))
        except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as error:
            raise ConfigError(
                f"hydra.sweeper.storage: cannot open the study's database {redact_text(url)}: "
                f"{database_error(error)}"
            ) from None


class _StorageOutage(LitlabError):
    """The study's database did not answer for ``storage_outage_s``: the sweep ends in one line."""

    exit_code = EXIT_FAILED


def _connection_lost(error: BaseException) -> bool:
    """Whether Optuna's error means the database did not answer (connection, restart, locked file)."""
    import sqlalchemy.exc

    lost = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)
    return any(isinstance(cause, lost) for cause in error_chain(error))


def _database_address(url: str) -> str:
    """``host:port`` of a study's database for a message (never the user or password), or SQLite's file."""
    import sqlalchemy.engine

    parsed = sqlalchemy.engine.make_url(url)
    if not parsed.host:
        return str(parsed.database)
    port = parsed.port or {"postgresql": 5432, "mysql": 3306}.get(parsed.get_backend_name())
    return f"{parsed.host}:{port}" if port else parsed.host


# --- the budget ----------------------------------------------------------------------------------


@dataclass
class _Budget:
    spent: int  # completed, pruned, failed and not retried
    running: int  # running now (in any worker)

    def can_ask(self, n_trials: int) -> bool:
        return self.spent + self.running < n_trials

    def done(self, n_trials: int) -> bool:
        return self.spent >= n_trials


def budget_of(trials: Sequence[optuna.trial.FrozenTrial], below: int | None = None) -> _Budget:
    """The study's budget; with ``below``, of the trials numbered lower only."""
    from optuna.trial import TrialState

    # Failed trials that a later trial retries: RetryFailedTrialCallback.retry_history, without its warning.
    retried = {number for trial in trials for number in trial.system_attrs.get("retry_history", [])}
    budget = _Budget(0, 0)
    for trial in trials:
        if trial.user_attrs.get(UNUSED_ATTR) or (below is not None and trial.number >= below):
            continue
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            budget.spent += 1
        elif trial.state == TrialState.FAIL:
            budget.spent += trial.number not in retried
        elif trial.state == TrialState.RUNNING:
            budget.running += 1
    return budget


def _make_sampler(sampler: dict[str, Any]) -> Any:
    """The sampler, its seed mixed with host and pid: workers of one study draw different trials."""
    import optuna

    name, seed = sampler.get("name", "tpe"), sampler.get("seed")
    if seed is not None:
        text = f"{seed}:{socket.gethostname()}:{os.getpid()}"
        seed = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=int(sampler.get("n_startup_trials", 10))
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"hydra.sweeper.sampler.name={name}: choose one of tpe, random")


# --- the sweeper ---------------------------------------------------------------------------------


@dataclass(eq=False)  # hashable and compared by identity, as any plugin
class OptunaSearch(PlanningSweeper):
    """Hydra sweeper: an Optuna study on ask-and-tell. It asks (``next_job``) and tells (``on_done``)
    from the pool's loop, records its trials' heartbeats from a thread of its own, and reaches the
    study's database through ``_db``, which waits out an outage. Its settings: hydra/sweeper/optuna.yaml."""

    params: dict[str, str] | None = None
    n_trials: int = 20
    direction: str = "maximize"
    sampler: dict[str, Any] | None = None
    pruner: str = "median"
    pruning: dict[str, Any] | None = None
    storage: str | None = None
    study_name: str | None = None
    enqueue: Sequence[str] | None = None
    heartbeat_interval: int = 60
    max_retry: int = 3
    storage_outage_s: float = 60
    n_jobs: int = 1

    def __post_init__(self) -> None:
        # Hydra passes an interpolated value (${oc.env:N}) as the string it resolves to.
        self.n_trials, self.heartbeat_interval = int(self.n_trials), int(self.heartbeat_interval)
        self.max_retry, self.n_jobs = int(self.max_retry), int(self.n_jobs)
        self.storage_outage_s = float(self.storage_outage_s)
        self.direction, self.pruner = str(self.direction), str(self.pruner)
        self.params, self.sampler = dict(self.params or {}), dict(self.sampler or {})
        self.pruning, self.enqueue = dict(self.pruning or {}), list(self.enqueue or [])
        self.first_job = 0  # the number of its first job (after an earlier attempt's in the same folder)
        self.plans: list[JobPlan] = []  # this sweep's trials so far: none may share another's folder
        self.running: dict[int, Any] = {}  # job index -> its optuna.trial.Trial
        self.returns: list[JobReturn] = []  # one per job, in the order they ended
        self.lock = threading.RLock()  # the pool may call back from its own threads; so does the heartbeat
        self.down_since: float | None = None  # when the study's database stopped answering
        self.outage: _StorageOutage | None = None  # it did not answer for storage_outage_s

    def run(self, arguments: list[str]) -> list[JobReturn]:
        """The search. Bad settings, or a database out of reach at the start: ConfigError (exit 2); a
        database that stops answering for ``storage_outage_s`` while it runs: _StorageOutage (exit 1)."""
        self._open_study(arguments)
        self.sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_record.start(self.sweep_dir, [*(f"{k}={v}" for k, v in self.params.items()), *arguments])
        # The same command into the same folder: its trials are jobs after the earlier attempts' ones.
        self.first_job = 1 + max((e["job_num"] for e in sweep_record.read(self.sweep_dir)[0]), default=-1)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        self.metric = str(self.config.optimized_metric)
        budget = self.budget()  # a dead sweep's trials are failed (and retried) first
        name = self.study.study_name
        log.info(
            f"Optuna study {name} in {redact_text(self.url)}: {budget.spent} of {self.n_trials} trials "
            f"spent, {budget.running} running in other sweeps; sampler "
            f"{self.sampler.get('name', 'tpe')}, pruner {self.pruner}"
        )
        if budget.done(self.n_trials):
            log.warning(
                f"study {name} already has its {self.n_trials} trials ({budget.spent} spent), so nothing "
                f"is left to run; the report and {_BEST_TRIAL_FILE} are the study's. To search on: "
                f"hydra.sweeper.n_trials={budget.spent + self.n_trials} (or more); to start another "
                "study: hydra.sweeper.study_name=<name>"
            )
            _record_study(self.study, self.sweep_dir)
        stopped = threading.Event()
        heartbeat = threading.Thread(target=self._beat, args=(stopped,), name="optuna-heartbeat", daemon=True)
        heartbeat.start()
        try:
            self._run_trials()
        finally:
            stopped.set()
            heartbeat.join(timeout=10)
        self._db(self._write_best_trial, final=True)
        return self.returns

    def _open_study(self, arguments: list[str]) -> None:
        """The settings checked, the space parsed and checked, and the study opened (or continued)."""
        import optuna

        cfg = self.config
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction}: choose maximize or minimize")
        if self.n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={self.n_trials}: at least 1")
        quiet_optuna()
        max_epochs = OmegaConf.select(cfg, "trainer.max_epochs", default=None)
        pruner_spec = {"name": self.pruner, **self.pruning, "max_epochs": max_epochs}
        pruner = make_pruner(pruner_spec)  # one it does not know: a ConfigError
        self.space = search_space(self.params, arguments)
        if not self.space.distributions:
            raise ConfigError("hparams_search: no parameter to search (hydra.sweeper.params is empty)")
        enqueued = parse_enqueued(self.enqueue)
        self._check_space(self.space)
        name = self.study_name or study_name_of(cfg.experiment_name, arguments, self.space, self.direction)
        self.url = storage_url(self.storage, str(cfg.storage.root), name)
        self.where = _database_address(self.url)
        self.study = optuna.create_study(
            study_name=name,
            storage=_open_storage(self.url, self.heartbeat_interval, self.max_retry, self.storage_outage_s),
            sampler=_make_sampler(self.sampler),
            pruner=pruner,
            direction=self.direction,
            load_if_exists=True,
        )
        if enqueued and not self.study.get_trials(deepcopy=False):  # the worker that found it empty
            for params in enqueued:
                self.study.enqueue_trial(params)
        self.trial_env = {"storage": self.url, "study": name, "pruner": pruner_spec}

    def check_composes(self, overrides: list[str]) -> JobPlan:
        """A ConfigError (one line) when a trial's overrides do not compose, or when it would share a
        run name or folder with an earlier trial that trains differently: before its job starts."""
        assert self.hydra_context is not None and self.config is not None
        refusal = "the search's overrides {} do not compose"
        plan = plan_job(self.hydra_context, self.config, overrides, len(self.plans), refusal)
        distinct_runs([*self.plans, plan])
        self.plans.append(plan)  # a refused trial is not one the later ones are checked against
        return plan

    def _check_space(self, space: _SearchSpace) -> None:
        """Before any trial: every choice composes, and the space's two ends get folders of their own."""
        ends = {
            name: d.choices if hasattr(d, "choices") else (d.low, d.high)
            for name, d in space.distributions.items()
        }
        points = [{name: values[end] for name, values in ends.items()} for end in (0, -1)]
        for name, distribution in space.distributions.items():
            points += [{name: choice} for choice in getattr(distribution, "choices", ())]
        for params in points:
            self.check_composes([*space.fixed, *trial_overrides(params)])
        self.plans.clear()  # what they checked; the trials are checked against each other

    def _run_trials(self) -> None:
        """Ask whenever the launcher has room and tell as jobs end, until the study has n_trials spent."""
        run_queue = getattr(self.launcher, "run_queue", self._run_batches)
        while True:
            # Job numbers go on from the last queue's: every job it was given has ended.
            run_queue(self.next_job, self.on_done, first_index=self.first_job + len(self.returns))
            if self.outage is not None:
                raise self.outage
            if self.finished_waiting():
                return

    def _run_batches(self, next_job: Callable, on_done: Callable, first_index: int) -> None:
        """``run_queue`` for launchers without one: batches of ``n_jobs`` trials. A batch's jobs are
        numbered in a row, so a refused trial (never launched) ends one."""
        job_idx = first_index
        while True:
            batch: list[QueuedJob] = []
            while len(batch) < max(1, self.n_jobs):
                job = next_job(job_idx + len(batch))
                if job is None or job.refusal is not None:
                    break
                batch.append(job)
            if batch:
                overrides = [[*queued.overrides, _env_set(queued.env)] for queued in batch]
                returns = self.launcher.launch(overrides, initial_job_idx=job_idx)  # next_job checked each
                for offset, job_return in enumerate(returns):
                    on_done(job_idx + offset, job_return)
                job_idx += len(batch)
            if job is None:
                return
            if job.refusal is not None:
                on_done(job_idx, self._refused(job_idx, job))
                job_idx += 1

    def _refused(self, job_idx: int, job: QueuedJob) -> JobReturn:
        """A trial that fails a rule, never launched: its summary.json and the sweep's record say why."""
        sweep_hydra_config = HydraConfig.instance().cfg
        job_dir = self.sweep_dir / str(job_idx)
        try:
            config = job_config(self.hydra_context, self.config, job.overrides, job_idx)
            not_started(task_config(config), job_dir, str(job.refusal)).write(job_dir / "summary.json")
        finally:
            HydraConfig.instance().cfg = sweep_hydra_config
        return JobReturn(working_dir=str(job_dir))

    # --- the study's database, and the trials of this worker --------------------------------------

    def _db(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call`` on the study's database, retried each second for ``storage_outage_s``, then an outage."""
        with self.lock:
            while self.outage is None:
                try:
                    result = call(*args, **kwargs)
                except Exception as error:
                    if not _connection_lost(error):
                        raise
                    self._wait_for_database(database_error(error))  # a second more, or the outage
                    continue
                if self.down_since is not None:
                    took = time.monotonic() - self.down_since
                    log.info(f"the study's database {self.where} answers again after {took:.0f} s")
                    self.down_since = None
                return result
            raise self.outage

    def _wait_for_database(self, reason: str) -> None:
        """Sleep a second while within ``storage_outage_s`` of the first failure; past it, the outage."""
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            log.warning(
                f"the study's database {self.where} does not answer ({reason}): trying again "
                f"for up to {self.storage_outage_s:.0f} s (hydra.sweeper.storage_outage_s)"
            )
        if now - self.down_since < self.storage_outage_s:
            time.sleep(1.0)
            return
        stopping = bool(self.running) and hasattr(self.launcher, "stop")
        stopped = (
            "stopped its running trials at a checkpoint" if stopping else "stopped (no trial was running)"
        )
        self.outage = _StorageOutage(
            f"the study's database {self.where} did not answer for {self.storage_outage_s:.0f} s "
            f"(hydra.sweeper.storage_outage_s; {reason}), so the sweep {stopped}: run the same "
            "command once the database is back, and the study continues where it stopped"
            + (" (the stopped trials resume)" if stopping else "")
        )
        if stopping:  # at a checkpoint, as on SIGTERM
            self.launcher.stop("an outage of the study's database")

    def budget(self) -> _Budget:
        import optuna

        self._db(optuna.storages.fail_stale_trials, self.study)  # a dead worker's trials, failed and retried
        return budget_of(self._db(self.study.get_trials, deepcopy=False))

    def next_job(self, job_idx: int) -> QueuedJob | None:
        """The next trial as a job, or None while the budget is spent or held by running trials. A
        trial whose config fails a rule is a job with a ``refusal``: a failed row, never started (one
        that does not compose ends the search)."""
        with self.lock:
            try:
                return self._ask(job_idx)
            except _StorageOutage:
                return None

    def _ask(self, job_idx: int) -> QueuedJob | None:
        import optuna

        if not self.budget().can_ask(self.n_trials):
            return None
        trial = self._db(self.study.ask, self.space.distributions)
        self._db(self.study._storage.record_heartbeat, trial._trial_id)
        trials = self._db(self.study.get_trials, deepcopy=False)
        # The spent and running trials numbered lower come first: workers that asked at once agree.
        if not budget_of(trials, below=trial.number).can_ask(self.n_trials):
            self._db(self._give_back, trial, trials)
            return None
        if (earlier := self._completed_attempt(trial, trials)) is not None:  # told, not trained again
            folder = earlier.user_attrs["job_dir"]
            told = f"trial {trial.number}: told from trial {earlier.number}, which completed in {folder}"
            log.info(f"{told} while the study's database was down")
            self._db(trial.set_user_attr, "job_dir", folder)
            self._db(self._tell, trial, _job_summary(earlier))
            return self._ask(job_idx)
        self._db(trial.set_user_attr, "job_dir", str(self.sweep_dir / str(job_idx)))
        self._db(trial.set_user_attr, "host", socket.gethostname())
        overrides = [*self.space.fixed, *trial_overrides(trial.params)]
        refusal = None
        try:
            self.check_composes(overrides).record(self.sweep_dir, job_idx)  # recorded as it is asked for
        except NotComposed:
            self._db(self.study.tell, trial, state=optuna.trial.TrialState.FAIL)
            raise
        except ConfigError as error:  # a rule this point fails (a batch that does not divide): a failed row
            refusal = one_line(error)
        self.running[job_idx] = trial
        log.info("trial %d (job %d): %s", trial.number, job_idx, " ".join(trial_overrides(trial.params)))
        env = {TRIAL_ENV: json.dumps({**self.trial_env, "trial": trial.number})}
        return QueuedJob(overrides=overrides, env=env, refusal=refusal)

    def _completed_attempt(self, trial: Any, trials: Sequence[Any]) -> Any | None:
        """An earlier attempt of a retried trial that completed but was never told (database down)."""
        import optuna

        by_number = {t.number: t for t in trials}
        for number in optuna.storages.RetryFailedTrialCallback.retry_history(by_number[trial.number]):
            summary = _job_summary(by_number[number])
            metric = (summary.get("metrics") or {}).get(self.metric)
            if summary.get("status") == "completed" and finite(metric):
                return by_number[number]
        return None

    def _give_back(self, trial: Any, trials: Sequence[Any]) -> None:
        """Over the budget: the trial unused; an enqueued or retried one goes back to the queue."""
        import optuna

        frozen = next(t for t in trials if t.number == trial.number)
        trial.set_user_attr(UNUSED_ATTR, True)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        if "fixed_params" in frozen.system_attrs or "failed_trial" in frozen.system_attrs:
            self.study.add_trial(
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.WAITING,
                    params=frozen.params,
                    distributions=frozen.distributions,
                    system_attrs=frozen.system_attrs,
                )
            )

    def on_done(self, job_idx: int, job_return: JobReturn) -> None:
        """Tell the study how the trial of ``job_idx`` ended (its summary in the sweep's record).
        After an outage it stays running in the study: the same command retries it, from its checkpoint."""
        with self.lock:
            trial = self.running.pop(job_idx)
            self.returns.append(job_return)
            entry = sweep_record.read_json(self.sweep_dir / sweep_record.RECORD_DIR / f"{job_idx}.json")
            summary = (entry or {}).get("summary") or {}  # none: an entry point that stores no run
            try:
                self._db(self._tell, trial, summary)
            except _StorageOutage:
                log.warning("trial %d not told: the study's database does not answer", trial.number)

    def _tell(self, trial: Any, summary: dict[str, Any]) -> None:
        """One trial told once: tried again after an outage, a tell that got through is skipped."""
        from optuna.trial import TrialState

        status = summary.get("status")
        value = (summary.get("metrics") or {}).get(self.metric)
        if status == "completed" and finite(value):
            self.study.tell(trial, float(value), skip_if_finished=True)
            log.info("trial %d: %s = %.4g", trial.number, self.metric, value)
            self._write_best_trial()
            return
        state = TrialState.PRUNED if status == "pruned" else TrialState.FAIL
        self.study.tell(trial, state=state, skip_if_finished=True)
        if status == "pruned":
            log.info("trial %d pruned at epoch %s", trial.number, summary.get("pruned_epoch"))
        elif status == "interrupted":  # SIGTERM: retried, and the retry resumes from its checkpoint
            frozen = self.study._storage.get_trial(trial._trial_id)
            # The storage's callback: the one that knows hydra.sweeper.max_retry (_open_storage).
            self.study._storage.get_heartbeat_stale_trial_callback()(self.study, frozen)
            log.warning("trial %d interrupted: the same command retries it", trial.number)
        else:
            lost = f"{self.metric} was not logged" if status == "completed" else "no summary.json"
            log.warning("trial %d failed: %s", trial.number, summary.get("error") or lost)

    def _beat(self, stopped: threading.Event) -> None:
        """The heartbeats of this worker's running trials, until the search ends or the database is gone."""
        while not stopped.wait(self.heartbeat_interval):
            with self.lock:
                try:
                    for trial in self.running.values():
                        self._db(self.study._storage.record_heartbeat, trial._trial_id)
                except _StorageOutage:
                    return

    def finished_waiting(self) -> bool:
        """True when the study is done; otherwise wait until a trial can be asked again (a running
        trial elsewhere failed or went stale) and return False."""
        while True:
            budget = self.budget()
            if budget.done(self.n_trials):
                return True
            if budget.can_ask(self.n_trials):
                return False
            time.sleep(WAIT_FOR_OTHERS_S)

    def _write_best_trial(self, final: bool = False) -> None:
        """best_trial.yaml (the best trial, its value, the command that trains it, the counts), after
        every completed trial and at the end (``final``: say what it holds)."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        path = self.sweep_dir / _BEST_TRIAL_FILE
        if not any(t.state == TrialState.COMPLETE for t in trials):
            if final:
                log.warning("no trial of study %s completed: no %s", self.study.study_name, path.name)
            return
        best = self.study.best_trial
        fixed = [a for a in self.space.fixed if not a.startswith(_SEARCH_ONLY) and not a.startswith("hydra.")]
        command = ["litlab-train", *fixed, *trial_overrides(best.params)]
        counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
        plain = (int, float, bool, type(None))
        record = {
            "study": self.study.study_name,
            "storage": redact_text(self.url),
            "direction": self.study.direction.name.lower(),
            "trial": best.number,
            "value": best.value,
            "params": {name: v if isinstance(v, plain) else str(v) for name, v in best.params.items()},
            "command": shlex.join(command),
            "job_dir": best.user_attrs.get("job_dir"),
            "host": best.user_attrs.get("host"),
            "n_trials": self.n_trials,
            "trials": {state: count for state, count in counts.items() if count},
        }
        write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(record)))
        if final:
            log.info("best trial %d: value %.4g; %s", best.number, best.value, path)


def _job_summary(trial: Any) -> dict[str, Any]:
    """The summary.json of the job that ran ``trial`` (its ``job_dir``); {} where there is none."""
    folder = trial.user_attrs.get("job_dir")
    return (sweep_record.read_json(Path(folder) / "summary.json") if folder else None) or {}


def _record_study(study: optuna.Study, sweep_dir: Path) -> None:
    """The sweep's record of a study complete before it started: each trial skipped, with its summary."""
    for trial in study.get_trials(deepcopy=False):
        summary = _job_summary(trial)
        if summary and not trial.user_attrs.get(UNUSED_ATTR):
            note = f"trial {trial.number} of study {study.study_name}, {sweep_record.skipped_note(summary)}"
            sweep_record.write_job(
                sweep_dir,
                trial.number,
                sweep_record.SKIPPED,
                summary,
                run_dir=Path(summary.get("run_dir") or trial.user_attrs["job_dir"]),
                overrides=summary.get("overrides") or [],
                note=note,
            )


def _env_set(env: dict[str, str]) -> str:
    """A trial's env as the override that sets it in a batch launcher's job (a quoted Hydra string)."""
    value = env[TRIAL_ENV].replace("\\", "\\\\").replace("'", "\\'")
    return f"++hydra.job.env_set.{TRIAL_ENV}='{value}'"
