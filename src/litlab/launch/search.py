"""litlab's Optuna search: a Hydra sweeper on Optuna's ask-and-tell API (``hparams_search=optuna``).

``OptunaSearch`` is registered as ``hydra/sweeper=optuna`` through ``hydra_plugins.litlab_search`` and
imports Optuna only when a search starts. A trial is asked for whenever the pool has a free slot; the
study lives in Optuna RDB storage, named by the command (``study_name_of``), so the same command
continues it, on one machine or many; a trial whose heartbeat stopped is retried with its parameters,
and no more than ``n_trials`` are spent. The best trial is written to ``<sweep dir>/best_trial.yaml``.
What it guarantees and how: docs/sweeps.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from litlab.config.identity import NOT_SETTINGS
from litlab.config.pruners import TRIAL_ENV, check_pruner, make_pruner, quiet_optuna
from litlab.config.redact import redact_text
from litlab.config.rules import ConfigError
from litlab.launch.multirun import JobPlan, PlanningSweeper, distinct_runs, job_config
from litlab.launch.pool import QueuedJob
from litlab.run import sweep_record

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random")
BEST_TRIAL_FILE = "best_trial.yaml"
# A trial this worker asked for over the budget (another worker asked at the same moment) and gave back.
UNUSED_ATTR = "litlab_unused"
# Overrides that pick the search itself: not part of a trial's own command.
_SEARCH_ONLY = ("hparams_search=", "+hparams_search=")
# How often a worker whose remaining budget is held by other workers' trials looks again (seconds).
WAIT_FOR_OTHERS_S = 2.0


# --- the search space ----------------------------------------------------------------------------


def distribution_of(override: Override) -> Any:
    """The Optuna distribution of one sweep override in Hydra's syntax:

    - ``interval(a, b)``: a float in [a, b]; ``tag(log, interval(a, b))`` log-uniform;
      ``tag(int, interval(a, b))`` (or ``tag(int, log, ...)``) an integer;
    - ``range(start, stop[, step])``: the values ``range`` lists (stop excluded), as a stepped int or
      float distribution; ``shuffle(range(...))`` a categorical;
    - ``choice(a, b, ...)`` or ``a,b,...``: a categorical.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    key = override.get_key_element()
    if isinstance(value, IntervalSweep):
        tags = set(value.tags)
        unknown = tags - {"log", "int"}
        if unknown:
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
        # Encoded as an override's value (strings quoted where Hydra needs it), so that the value
        # Optuna hands back is written into the trial's command as it is.
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    raise ConfigError(f"{override.input_line}: a search parameter is interval, range or choice")


@dataclass
class SearchSpace:
    """The search's parameters (name -> Optuna distribution) and its fixed overrides, as typed."""

    distributions: dict[str, Any] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)


def search_space(params: dict[str, str], arguments: Sequence[str]) -> SearchSpace:
    """``hydra.sweeper.params`` and the command line's overrides, parsed with Hydra's parser: sweep
    overrides become distributions, the others stay fixed overrides (exactly as typed). A parameter
    given on the command line replaces the one of the params."""
    parser = OverridesParser.create()
    lines = [f"{key}={value}" for key, value in params.items()] + list(arguments)
    space = SearchSpace()
    fixed: dict[str, str] = {}
    for override in parser.parse_overrides(lines):
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
        trial = {}
        for override in parser.parse_overrides(shlex.split(line)):
            if override.is_sweep_override():
                raise ConfigError(
                    f"hydra.sweeper.enqueue: '{line}' gives one value per parameter, not a sweep"
                )
            trial[override.get_key_element()] = override.value()
        trials.append(trial)
    return trials


# --- the study's name and storage ----------------------------------------------------------------


def study_name_of(experiment_name: str, arguments: Sequence[str], space: SearchSpace, direction: str) -> str:
    """The study of a command: the experiment name plus a hash of what defines the search, so the
    same command continues the same study. In it: the command line's overrides that define the runs
    (as the run's settings take them: not where runs are stored or logged, nor how they are
    launched), the search space and the direction. Not in it: n_trials (raise it to extend a
    search), the storage, the sampler, the pruner, the launcher."""
    keys = {a: re.split(r"[./=]", a.lstrip("+~"), maxsplit=1)[0] for a in arguments}
    overrides = sorted(a for a, key in keys.items() if key not in NOT_SETTINGS)
    space_text = [f"{name}: {dist!r}" for name, dist in sorted(space.distributions.items())]
    text = "\n".join([*overrides, "--", *space_text, "--", direction])
    return f"{experiment_name}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def storage_url(storage: str | None, storage_root: str, study_name: str) -> str:
    """The SQLAlchemy URL of the study's storage. ``None``: ``<storage.root>/optuna/<study>.db`` in
    SQLite, which needs a local storage root. ``postgresql://`` and ``postgres://`` use psycopg 3."""
    if storage is None:
        scheme = urlsplit(storage_root).scheme
        if scheme not in ("", "file"):
            raise ConfigError(
                f"hydra.sweeper.storage=null keeps the study in a SQLite file under storage.root, but "
                f"storage.root={storage_root} is not on this machine's disk: set hydra.sweeper.storage "
                "to a database URL (postgresql://user@host/db) or a sqlite:////path/study.db"
            )
        root = Path(storage_root.removeprefix("file://")).expanduser().resolve()
        folder = root / "optuna"
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{folder / study_name}.db"
    for plain in ("postgresql://", "postgres://"):
        if storage.startswith(plain):
            return "postgresql+psycopg://" + storage[len(plain) :]
    if "://" not in storage:
        raise ConfigError(
            f"hydra.sweeper.storage={storage}: not a database URL; use postgresql://user@host/db, "
            "sqlite:////path/study.db, or null (a SQLite file under storage.root)"
        )
    return storage


def open_storage(url: str, heartbeat_interval: int, max_retry: int) -> Any:
    """The study's RDB storage, with heartbeats and retries of stale trials. Workers of one search
    started at the same moment (a job array) race to create Optuna's tables in a new database; the
    losers' CREATE fails on what the winner made, and their next try finds the tables there. A
    database that cannot be reached is one line naming the URL (without its password)."""
    import random

    import optuna
    import sqlalchemy.exc

    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs={"pool_pre_ping": True},
                heartbeat_interval=heartbeat_interval,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=max_retry
                ),
            )
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == 5:
                raise
            time.sleep(random.uniform(0.2, 1.0))  # another worker is creating the tables
        except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as error:
            reason = " ".join(str(error).split("\n")[0].split())
            raise ConfigError(
                f"hydra.sweeper.storage: cannot open the study's database {redact_text(url)}: {reason}"
            ) from None
    raise AssertionError("unreachable")


# --- the budget ----------------------------------------------------------------------------------


@dataclass
class Budget:
    spent: int  # completed, pruned, failed and not retried
    running: int  # running now (in any worker)
    waiting: int  # enqueued or retries, not asked for yet

    def can_ask(self, n_trials: int) -> bool:
        return self.spent + self.running < n_trials

    def done(self, n_trials: int) -> bool:
        return self.spent >= n_trials


def retried_numbers(trials: Sequence[optuna.trial.FrozenTrial]) -> set[int]:
    """Numbers of failed trials that a later trial retries (heartbeat-stale, or interrupted)."""
    numbers: set[int] = set()
    for trial in trials:  # RetryHeartbeatStaleTrialCallback.retry_history, without its warning
        numbers.update(trial.system_attrs.get("retry_history", []))
    return numbers


def budget_of(trials: Sequence[optuna.trial.FrozenTrial]) -> Budget:
    from optuna.trial import TrialState

    retried = retried_numbers(trials)
    spent = running = waiting = 0
    for trial in trials:
        if trial.user_attrs.get(UNUSED_ATTR):
            continue
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            spent += 1
        elif trial.state == TrialState.FAIL:
            spent += trial.number not in retried
        elif trial.state == TrialState.RUNNING:
            running += 1
        elif trial.state == TrialState.WAITING:
            waiting += 1
    return Budget(spent, running, waiting)


def within_budget(trials: Sequence[optuna.trial.FrozenTrial], number: int, n_trials: int) -> bool:
    """Whether trial ``number`` (just asked for) fits in ``n_trials``: the spent and running trials
    with lower numbers come first. Two workers that asked at once agree on which one is over."""
    from optuna.trial import TrialState

    retried = retried_numbers(trials)
    ahead = 0
    for trial in trials:
        if trial.number >= number or trial.user_attrs.get(UNUSED_ATTR):
            continue
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING) or (
            trial.state == TrialState.FAIL and trial.number not in retried
        ):
            ahead += 1
    return ahead < n_trials


# --- samplers and pruners ------------------------------------------------------------------------


def worker_seed(seed: int | None) -> int | None:
    """The seed of this worker's sampler: ``sampler.seed`` with the host and process id. Workers of
    one study (machines, or reruns of the command) given the same seed would otherwise draw the same
    parameters, trial for trial. A search with free slots is not repeatable draw for draw anyway:
    trials end, and are told, in the order the machine's timing gives."""
    if seed is None:
        return None
    text = f"{seed}:{socket.gethostname()}:{os.getpid()}"
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)


def make_sampler(sampler: dict[str, Any]) -> Any:
    import optuna

    name = sampler.get("name", "tpe")
    seed = worker_seed(sampler.get("seed"))
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=int(sampler.get("n_startup_trials", 10))
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"hydra.sweeper.sampler.name={name}: choose one of {', '.join(SAMPLERS)}")


# --- the sweeper ---------------------------------------------------------------------------------


class OptunaSearch(PlanningSweeper):
    """Hydra sweeper: an Optuna study on ask-and-tell (see the module's docstring)."""

    def __init__(
        self,
        params: dict[str, str] | None = None,
        n_trials: int = 20,
        direction: str = "maximize",
        sampler: dict[str, Any] | None = None,
        pruner: str = "median",
        pruning: dict[str, Any] | None = None,
        storage: str | None = None,
        study_name: str | None = None,
        enqueue: Sequence[str] | None = None,
        heartbeat_interval: int = 60,
        max_retry: int = 3,
        n_jobs: int = 1,
    ) -> None:
        self.params = dict(params or {})
        self.n_trials = int(n_trials)
        self.direction = str(direction)
        self.sampler_spec = dict(sampler or {})
        self.pruner_name = str(pruner)
        self.pruning = dict(pruning or {})
        self.storage = storage
        self.study_name = study_name
        self.enqueue = list(enqueue or [])
        self.heartbeat_interval = int(heartbeat_interval)
        self.max_retry = int(max_retry)
        self.n_jobs = int(n_jobs)
        self.plans: list[JobPlan] = []  # this sweep's trials so far: none may share another's folder

    def run(self, arguments: list[str]) -> list[JobReturn]:
        """The search; bad settings or a database out of reach raise ConfigError (one line, exit 2)."""
        import optuna

        cfg = self.config
        if self.direction not in ("maximize", "minimize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction}: choose maximize or minimize")
        if self.n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={self.n_trials}: at least 1")
        check_pruner(self.pruner_name)
        space = search_space(self.params, arguments)
        if not space.distributions:
            raise ConfigError("hparams_search: no parameter to search (hydra.sweeper.params is empty)")
        enqueued = parse_enqueued(self.enqueue)
        self._check_space(space)
        name = self.study_name or study_name_of(cfg.experiment_name, arguments, space, self.direction)
        url = storage_url(self.storage, str(cfg.storage.root), name)
        quiet_optuna()
        sampler = make_sampler(self.sampler_spec)
        pruner_spec = {"name": self.pruner_name, **self.pruning, "max_epochs": _max_epochs(cfg)}
        pruner = make_pruner(pruner_spec)
        storage = open_storage(url, self.heartbeat_interval, self.max_retry)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction=self.direction,
            load_if_exists=True,
        )
        if enqueued and not study.get_trials(deepcopy=False):  # the worker that found the study empty
            for params in enqueued:
                study.enqueue_trial(params)
        sweep_dir = Path(cfg.hydra.sweep.dir)
        sweep_record.start(sweep_dir, [*(f"{k}={v}" for k, v in self.params.items()), *arguments])
        OmegaConf.save(cfg, sweep_dir / "multirun.yaml")
        trials = _Trials(
            study,
            space,
            self.check_composes,
            self.n_trials,
            env={"storage": url, "study": name, "pruner": pruner_spec},
            sweep_dir=sweep_dir,
            metric=str(cfg.optimized_metric),
        )
        budget = trials.budget()  # a dead sweep's trials are failed (and retried) first
        log.info(
            "Optuna study %s in %s: %d of %d trials spent, %d running in other sweeps; sampler %s, pruner %s",
            name,
            redact_text(url),
            budget.spent,
            self.n_trials,
            budget.running,
            self.sampler_spec.get("name", "tpe"),
            self.pruner_name,
        )
        if budget.done(self.n_trials):
            log.warning(
                "study %s already has its %d trials (%d spent), so nothing is left to run; the report "
                "and %s are the study's. To search on: hydra.sweeper.n_trials=%d (or more); to start "
                "another study: hydra.sweeper.study_name=<name>",
                name,
                self.n_trials,
                budget.spent,
                BEST_TRIAL_FILE,
                budget.spent + self.n_trials,
            )
            record_study(study, sweep_dir)
        heartbeat = _Heartbeat(trials, self.heartbeat_interval)
        heartbeat.start()
        try:
            if hasattr(self.launcher, "run_queue"):
                self._run_async(trials)
            else:
                self._run_batches(trials)
        finally:
            heartbeat.stop()
        write_best_trial(study, sweep_dir / BEST_TRIAL_FILE, space, url, self.n_trials)
        return trials.returns

    def check_composes(self, overrides: list[str]) -> None:
        """A ConfigError (one line) when a trial's overrides do not compose (``model=choice(mlp,
        nosuch)``), or when it would share a run name or folder with an earlier trial of this sweep
        that trains differently (``multirun.distinct_runs``): said before its job starts."""
        assert self.hydra_context is not None and self.config is not None
        sweep_hydra_config = HydraConfig.instance().cfg
        try:
            config = job_config(self.hydra_context, self.config, overrides, len(self.plans))
        except ConfigError as error:
            raise ConfigError(
                f"the search's overrides {' '.join(overrides)} do not compose: {error}"
            ) from None
        finally:
            HydraConfig.instance().cfg = sweep_hydra_config
        self.plans.append(JobPlan.of(config, overrides))
        distinct_runs(self.plans)

    def _check_space(self, space: SearchSpace) -> None:
        """Before any trial: every choice of every categorical parameter composes, and trials at the
        two ends of the space get folders of their own (a fixed ``run_name`` or ``hydra.run.dir`` is
        refused)."""
        points = [{name: _end_of(dist, end) for name, dist in space.distributions.items()} for end in (0, -1)]
        for name, distribution in space.distributions.items():
            points += [{name: choice} for choice in getattr(distribution, "choices", ())]
        for params in points:
            self.check_composes([*space.fixed, *trial_overrides(params)])
        self.plans.clear()  # what they checked; the trials are checked against each other

    def _run_async(self, trials: _Trials) -> None:
        """Ask whenever the pool has room, tell as each job ends; when the rest of the budget is held
        by other workers' trials, wait for them (a dead worker's trials turn stale and come back as
        retries) until the study has n_trials spent."""
        while True:
            self.launcher.run_queue(trials.next_job, trials.on_done, first_index=trials.next_index)
            if trials.finished_waiting():
                return

    def _run_batches(self, trials: _Trials) -> None:
        """Launchers without ``run_queue`` (joblib, submitit): batches of ``n_jobs`` trials."""
        job_idx = 0
        while True:
            batch = []
            for _ in range(max(1, self.n_jobs)):
                job = trials.next_job(job_idx + len(batch))
                if job is None:
                    break
                batch.append(job)
            if not batch:
                if trials.finished_waiting():
                    return
                continue
            overrides = [
                [*job.overrides, f"++hydra.job.env_set.{TRIAL_ENV}={_quoted(job.env[TRIAL_ENV])}"]
                for job in batch
            ]
            returns = self.launcher.launch(overrides, initial_job_idx=job_idx)  # next_job checked each
            for offset, job_return in enumerate(returns):
                trials.on_done(job_idx + offset, job_return)
            job_idx += len(batch)


def _end_of(distribution: Any, end: int) -> Any:
    """The first (``end=0``) or last (-1) value of a distribution: a choice, or a bound."""
    choices = getattr(distribution, "choices", None)
    if choices is not None:
        return choices[end]
    return distribution.low if end == 0 else distribution.high


def record_study(study: optuna.Study, sweep_dir: Path) -> None:
    """The sweep's record of a study that was complete before it started: each of its trials, as
    skipped, with the summary of the job that ran it (found through the trial's ``job_dir``)."""
    for trial in study.get_trials(deepcopy=False):
        folder = trial.user_attrs.get("job_dir")
        summary = _job_summary(JobReturn(), Path(folder)) if folder else {}
        if summary and not trial.user_attrs.get(UNUSED_ATTR):
            note = f"trial {trial.number} of study {study.study_name}, {sweep_record.skipped_note(summary)}"
            run_dir = Path(summary.get("run_dir") or folder)
            overrides = summary.get("overrides") or []
            sweep_record.write_job(
                sweep_dir,
                trial.number,
                sweep_record.SKIPPED,
                summary,
                run_dir=run_dir,
                overrides=overrides,
                note=note,
            )


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _max_epochs(cfg: DictConfig) -> int | None:
    value = OmegaConf.select(cfg, "trainer.max_epochs", default=None)
    return value if isinstance(value, int) and value > 0 else None


class _Trials:
    """The trials of one worker: asks (``next_job``), tells (``on_done``), keeps the budget."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        check_composes: Callable[[list[str]], None],
        n_trials: int,
        env: dict[str, Any],
        sweep_dir: Path,
        metric: str,
    ) -> None:
        self.study = study
        self.space = space
        self.check_composes = check_composes
        self.n_trials = n_trials
        self.env = env
        self.sweep_dir = sweep_dir
        self.metric = metric
        self.running: dict[int, Any] = {}  # job index -> its optuna.trial.Trial
        self.next_index = 0  # the sweep's next job number (job folders <sweep dir>/<job number>)
        self.returns: list[JobReturn] = []
        self.lock = threading.RLock()  # the pool may call back from its own threads; so does the heartbeat

    def budget(self) -> Budget:
        import optuna

        optuna.storages.fail_stale_trials(self.study)  # a dead worker's trials, failed and retried
        return budget_of(self.study.get_trials(deepcopy=False))

    def next_job(self, job_idx: int) -> Any:
        """The next trial as a job, or None while the budget is spent or held by running trials."""
        import optuna

        with self.lock:
            if not self.budget().can_ask(self.n_trials):
                return None
            trial = self.study.ask(self.space.distributions)
            self.record_heartbeat(trial)
            trials = self.study.get_trials(deepcopy=False)
            if not within_budget(trials, trial.number, self.n_trials):
                self._give_back(trial, trials)
                return None
            job_dir = self.sweep_dir / str(job_idx)
            trial.set_user_attr("job_dir", str(job_dir))
            trial.set_user_attr("host", socket.gethostname())
            overrides = [*self.space.fixed, *trial_overrides(trial.params)]
            try:
                self.check_composes(overrides)
            except ConfigError:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            self.running[job_idx] = trial
            log.info("trial %d (job %d): %s", trial.number, job_idx, " ".join(trial_overrides(trial.params)))
            env = {TRIAL_ENV: json.dumps({**self.env, "trial": trial.number})}
            self.next_index = max(self.next_index, job_idx + 1)
            return QueuedJob(overrides=overrides, env=env)

    def _give_back(self, trial: Any, trials: Sequence[Any]) -> None:
        """Another worker asked at the same moment and this trial is over the budget: mark it unused;
        an enqueued or retried trial goes back to the queue."""
        import optuna

        frozen = next(t for t in trials if t.number == trial.number)
        trial.set_user_attr(UNUSED_ATTR, True)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
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
        """Tell the study how the trial of ``job_idx`` ended (summary.json's status)."""
        import optuna
        from optuna.trial import TrialState

        with self.lock:
            trial = self.running.pop(job_idx)
            self.returns.append(job_return)
            summary = _job_summary(job_return, self.sweep_dir / str(job_idx))
            status = summary.get("status")
            value = (summary.get("metrics") or {}).get(self.metric)
            if status == "completed" and _finite(value):
                self.study.tell(trial, float(value))
                log.info("trial %d: %s = %.4g", trial.number, self.metric, value)
                write_best_trial_quietly(self)
            elif status == "pruned":
                self.study.tell(trial, state=TrialState.PRUNED)
                log.info("trial %d pruned at epoch %s", trial.number, summary.get("pruned_epoch"))
            elif status == "interrupted":  # SIGTERM: retried, and the retry resumes from its checkpoint
                self.study.tell(trial, state=TrialState.FAIL)
                frozen = self.study._storage.get_trial(trial._trial_id)
                optuna.storages.RetryHeartbeatStaleTrialCallback()(self.study, frozen)
                log.warning("trial %d interrupted: the same command retries it", trial.number)
            else:
                self.study.tell(trial, state=TrialState.FAIL)
                why = summary.get("error") or (
                    f"{self.metric} was not logged" if status == "completed" else "no summary.json"
                )
                log.warning("trial %d failed: %s", trial.number, why)

    def record_heartbeat(self, trial: Any) -> None:
        self.study._storage.record_heartbeat(trial._trial_id)

    def beat(self) -> None:
        with self.lock:
            for trial in self.running.values():
                self.record_heartbeat(trial)

    def finished_waiting(self) -> bool:
        """After this worker's queue ran dry: True when the study is done; otherwise wait until a
        trial can be asked again (a running trial elsewhere failed or went stale) and return False."""
        while True:
            with self.lock:
                budget = self.budget()
            if budget.done(self.n_trials):
                return True
            if budget.can_ask(self.n_trials):
                return False
            time.sleep(WAIT_FOR_OTHERS_S)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _job_summary(job_return: JobReturn, default_dir: Path) -> dict[str, Any]:
    """The job's summary.json ({} when it has none: it died before writing one)."""
    candidates = [default_dir]
    if job_return.working_dir:
        candidates.insert(0, Path(job_return.working_dir))
    for folder in candidates:
        path = folder / "summary.json"
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                return {}
    if job_return.status == JobStatus.COMPLETED and _finite(job_return.return_value):
        return {"status": "completed", "metrics": {}}
    return {}


class _Heartbeat:
    """Records a heartbeat for this worker's running trials every ``interval`` seconds."""

    def __init__(self, trials: _Trials, interval: int) -> None:
        self.trials = trials
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="optuna-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.trials.beat()
            except Exception as error:  # a database hiccup: the next beat tries again
                log.warning("Optuna heartbeat not recorded: %s", error)


# --- the best trial ------------------------------------------------------------------------------


def best_trial_record(
    study: optuna.Study, space: SearchSpace, url: str, n_trials: int
) -> dict[str, Any] | None:
    """What best_trial.yaml says: the best completed trial, its parameters and value, the command
    that trains it alone, and the study's counts."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if not completed:
        return None
    best = study.best_trial
    fixed = [a for a in space.fixed if not a.startswith(_SEARCH_ONLY) and not a.startswith("hydra.")]
    command = ["litlab-train", *fixed, *trial_overrides(best.params)]
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    return {
        "study": study.study_name,
        "storage": redact_text(url),
        "direction": study.direction.name.lower(),
        "trial": best.number,
        "value": best.value,
        "params": {name: _plain(value) for name, value in best.params.items()},
        "command": " ".join(shlex.quote(part) for part in command),
        "job_dir": best.user_attrs.get("job_dir"),
        "host": best.user_attrs.get("host"),
        "n_trials": n_trials,
        "trials": {state: count for state, count in counts.items() if count},
    }


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, bool, type(None))) else str(value)


def write_best_trial(study: optuna.Study, path: Path, space: SearchSpace, url: str, n_trials: int) -> None:
    record = best_trial_record(study, space, url, n_trials)
    if record is None:
        log.warning("no trial of study %s completed: no %s", study.study_name, path.name)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(record)))
    os.replace(tmp, path)
    log.info("best trial %d: value %.4g; %s", record["trial"], record["value"], path)


def write_best_trial_quietly(trials: _Trials) -> None:
    """best_trial.yaml after every completed trial, so a long search shows its best so far."""
    record = best_trial_record(trials.study, trials.space, trials.env["storage"], trials.n_trials)
    if record is not None:
        path = trials.sweep_dir / BEST_TRIAL_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(record)))
        os.replace(tmp, path)
