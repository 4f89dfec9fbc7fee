"""Everything around ``trainer.fit``: ``prepare_run`` decides what is decided once per run (seed,
identity, storage folder, resume point); ``finish`` tests the model and writes summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.progress import scalar_metrics
from litlab.callbacks.run_stats import RunStats
from litlab.config.identity import once, run_identity, run_settings, start_record
from litlab.config.redact import redact, redact_hydra_record
from litlab.config.rules import BatchSizes
from litlab.errors import EXIT_PREEMPTED
from litlab.logs import global_rank
from litlab.run import doctor
from litlab.run.ending import failure_reason
from litlab.run.hangs import stop_watching
from litlab.run.loggers import log_final_metrics
from litlab.run.summary import COMPLETED, FAILED, INTERRUPTED, PRUNED, Summary, sweep_job
from litlab.storage import resume
from litlab.storage.checkpoints import kept_checkpoint, last_checkpoint
from litlab.storage.lock import RunLock
from litlab.storage.roots import (
    RunStorage,
    StorageFailed,
    check_storage,
    storage_options,
    use_storage_options,
)

log = logging.getLogger("litlab")


@dataclass
class Run:
    dir: Path
    identity: str
    storage: RunStorage
    resume: resume.Decision | None = None
    started: float = field(default_factory=time.time)
    batch_sizes: BatchSizes | None = None
    precision: dict[str, str] = field(default_factory=dict)
    stats: RunStats | None = None
    resume_exact: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more summary fields (nonfinite, oom, tune, world)
    lock: RunLock | None = None  # held by global rank 0 while the run trains
    # strategy=ddp_notebook: Lightning forks the ranks from the process that prepared the run (its pid).
    forks_ranks: bool = False  # set once the Trainer is built
    pid: int = field(default_factory=os.getpid)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()

    @property
    def resume_from(self) -> str | None:
        """The checkpoint this start continues from; None for a fresh start."""
        return self.resume.point.url if self.resume is not None and self.resume.point else None

    @property
    def checkpoint_dir(self) -> str:
        return self.storage.checkpoint_url

    @property
    def stored_in_own_dir(self) -> bool:
        """The run's storage folder is its own directory (local storage, Hydra's default run dir)."""
        return self.storage.is_local and Path(self.storage.path).resolve() == self.dir.resolve()

    @property
    def is_global_zero(self) -> bool:
        return global_rank() == 0

    @property
    def fit_elsewhere(self) -> bool:
        """This process forked the ranks that fit (``strategy=ddp_notebook``; ``ForkedRankZero``)."""
        return self.forks_ranks and os.getpid() == self.pid

    @property
    def completed(self) -> bool:
        """The run of this identity already completed: the same command has nothing left to train."""
        return self.resume is not None and self.resume.completed_summary is not None

    def stored_metric(self, name: str) -> float | None:
        """A metric from the stored summary of a completed run (what the sweep's objective returns)."""
        summary = (self.resume.completed_summary if self.resume else None) or {}
        return summary.get("metrics", {}).get(name)

    def write_summary_json(self, summary: Summary) -> None:
        """Rank 0: summary.json in the run's folder, and in its storage folder where that is another."""
        if self.is_global_zero:
            summary.write(self.dir / "summary.json")
            if not self.stored_in_own_dir:
                self.storage.write_text("summary.json", summary.to_json())

    def note_precision(self, requested: str, effective: str) -> None:
        self.precision = {"requested": requested, "effective": effective}
        if requested != effective:
            log.warning(
                f"precision: requested {requested} but this accelerator runs {effective}; results of this "
                f"run are {effective} results, not {requested} (summary.json records both)"
            )

    @contextlib.contextmanager
    def recording_failure(self, cfg: DictConfig, trainer: L.Trainer) -> Iterator[None]:
        """Writes a ``status: failed`` summary (with the error) if the block raises, then re-raises."""
        try:
            yield
        except BaseException as error:
            failed, preempted = error, isinstance(error, SIGTERMException)
            if isinstance(error, StorageFailed):  # with what is left to resume from (Lightning holds the old)
                kept = f"{kept_checkpoint(trainer)}; once the storage works again the same command resumes"
                failed = StorageFailed(error.root, error.what, f"{error.cause}; {kept}")
            try:  # a storage that fails here too cannot hide the first error
                write_summary(
                    cfg, trainer, self, INTERRUPTED if preempted else FAILED, failure_reason(failed)
                )
            except (StorageFailed, OSError) as also:
                log.warning("summary.json of the stopped run not written everywhere: %s", also)
            if preempted:  # Lightning's SIGTERMException would exit with status 0
                log.warning(
                    "SIGTERM: stopped at global step %d, exiting with status %d; the same command resumes",
                    trainer.global_step,
                    EXIT_PREEMPTED,
                )
                stop_watching()  # recorded: what is left is the exit
                raise SystemExit(EXIT_PREEMPTED) from error
            if failed is not error:
                raise failed from error
            raise


def prepare_run(cfg: DictConfig) -> Run:
    """Seed; decide the run's identity, storage folder and resume point; take its lock (``with`` frees it)."""
    storage_cfg = OmegaConf.to_container(cfg.storage, resolve=True, throw_on_missing=True)
    once("storage", storage_cfg, lambda: check_storage(storage_cfg))  # unless this start's preflight did
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    settings = run_settings(cfg)
    identity = run_identity(cfg, settings)
    options = storage_options(cfg.storage)
    use_storage_options(cfg.storage.root, options)
    storage = RunStorage(cfg.storage.root, identity, options)
    run = Run(dir=run_dir, identity=identity, storage=storage)
    if run.is_global_zero:
        rewritten = redact_hydra_record(run_dir)  # a credential written in a config file, in .hydra/
        if rewritten:
            log.warning(
                "a credential written in a config file is redacted in %s/.hydra/ (%s): pass it through the "
                "environment (${oc.env:NAME}) instead",
                run_dir,
                ", ".join(rewritten),
            )
        # One process at a time per identity (two copies of one command, a job array).
        run.lock = RunLock(storage)
        run.lock.acquire()
    code = start_record(cfg, HydraConfig.get(), settings)
    run.extra["code_fingerprint"] = code["fingerprint"]
    run.extra["settings"] = settings
    run.resume = resume.decide(
        str(cfg.resume),
        storage,
        is_global_zero=run.is_global_zero,
        debug_run=bool(cfg.trainer.get("fast_dev_run")),  # a key the YAML leaves out: Lightning's default
        code=code,
    )
    storage = run.storage = run.resume.folder  # the identity's, or this code's version of it
    if run.resume.identity is not None:  # its earlier name, or a version of its own (resume.find)
        log.info("run %s %s; this start is run %s", identity, run.resume.why, run.resume.identity)
        identity = run.identity = run.resume.identity
    if run.completed:
        log.warning(resume.completed_message(storage, run.resume.completed_summary))
        if run.is_global_zero and not run.stored_in_own_dir:  # a sweep job's directory shows the outcome
            Summary.from_dict(run.resume.completed_summary).write(run_dir / "summary.json")
        return run
    if run.is_global_zero:
        storage.prepare()
        resume.continue_tensorboard(run.resume, resume.tensorboard_dir(cfg), storage)
        resume.record_start(storage, run.resume, run_dir)
        storage.write_text("config.yaml", OmegaConf.to_yaml(redact(cfg)))  # no credentials (redact.py)
    log.info("run %s in %s (checkpoints: %s)", identity, run_dir, run.checkpoint_dir)
    return run


def finish(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: L.LightningModule,
    data: L.LightningDataModule,
    run: Run,
) -> float | None:
    """Test the best checkpoint, write summary.json, and return the metric sweepers optimise."""
    pruned = run.extra.get("pruned_epoch") is not None  # an Optuna trial its pruner stopped: no test
    metrics = scalar_metrics(trainer.callback_metrics)  # trainer.test() replaces callback_metrics
    # Before trainer.test(ckpt_path=best): it restores the checkpoint callbacks' state as it was
    # when the best checkpoint was written, which forgets a last.ckpt written after it.
    checkpoints = _checkpoints(trainer, run)
    if cfg.test_after_fit and not pruned and is_overridden("test_step", module):
        tested = checkpoints["tested"] = checkpoints["best"]  # None (no checkpointing): weights as trained
        trainer.test(module, datamodule=data, ckpt_path=tested, weights_only=True, verbose=False)
        metrics.update(scalar_metrics(trainer.callback_metrics))
    status = PRUNED if pruned else COMPLETED
    summary = write_summary(cfg, trainer, run, status, metrics=metrics, checkpoints=checkpoints)
    log_final_metrics(trainer.loggers, summary, is_global_zero=trainer.is_global_zero)
    if trainer.is_global_zero:
        doctor.warn(summary.diagnosis)
        log.info(_result_line(summary, run.dir))  # the run's last line, once
    return summary.metrics.get(cfg.optimized_metric)


def _result_line(summary: Summary, run_dir: Path) -> str:
    """The last line of a run: the monitored and the test metric (4 significant figures), the run dir."""
    name = summary.optimized_metric
    names = [name, "test/" + name.split("/", 1)[-1]] if name else []
    shown = [f"{n} = {summary.metrics[n]:.4g}" for n in dict.fromkeys(names) if n in summary.metrics]
    missing = f"{name}: not logged" if name else "optimized_metric=null"
    return f"{', '.join(shown) or missing}; run: {run_dir}"


def _checkpoints(trainer: L.Trainer, run: Run) -> dict[str, Any]:
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else None
    return {"dir": run.checkpoint_dir, "best": best or None, "last": last_checkpoint(trainer), "tested": None}


class ForkedRankZero(Callback):
    """``strategy=ddp_notebook``: the fit's progress stays in the forked ranks, so forked rank 0 writes
    summary.json as its fit ends; the process that forked it tests and writes it again."""

    def __init__(self, cfg: DictConfig, run: Run) -> None:
        self.cfg, self.run = cfg, run

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and os.getpid() != self.run.pid:  # in the fork
            pruned = self.run.extra.get("pruned_epoch") is not None  # an Optuna trial its pruner stopped
            write_summary(self.cfg, trainer, self.run, status=PRUNED if pruned else COMPLETED)


def write_summary(
    cfg: DictConfig,
    trainer: L.Trainer,
    run: Run,
    status: str,
    error: str | None = None,
    metrics: dict[str, float] | None = None,
    checkpoints: dict[str, Any] | None = None,
) -> Summary:
    """The run's summary from its Trainer, with the doctor's diagnosis; rank 0 writes it."""
    sizes, stats, decision = run.batch_sizes, run.stats, run.resume or resume.Decision()
    device, environment = trainer.strategy.root_device, getattr(trainer.strategy, "cluster_environment", None)
    # The doctor's micro-batch check; a forked fit's rank 0 notes it (CUDA stays uninitialised here).
    if status in (COMPLETED, PRUNED) and device.type == "cuda" and not run.fit_elsewhere:
        run.extra["device_memory_mib"] = round(
            torch.cuda.get_device_properties(device).total_memory / 2**20, 1
        )
    summary = Summary.of(
        cfg,
        error,
        run_dir=run.dir,
        hydra=HydraConfig.get(),
        status=status,
        sweep=sweep_job(),
        metrics=dict(sorted((metrics or scalar_metrics(trainer.callback_metrics)).items())),
        checkpoints=checkpoints or _checkpoints(trainer, run),
        run_name=run.identity,
        storage_dir=run.storage.url,
        precision=run.precision,
        accelerator=device.type,
        devices=trainer.num_devices,
        num_nodes=trainer.num_nodes,
        world_size=trainer.world_size,
        cluster_environment=type(environment).__name__ if environment is not None else None,
        micro_batch_size=sizes.micro,
        accumulate_grad_batches=sizes.accumulation,
        effective_batch_size=sizes.effective,
        epochs=trainer.current_epoch,
        global_step=trainer.global_step,
        throughput={k: v for k, v in stats.stats.items() if k != "memory"},
        memory=stats.stats.get("memory"),
        resume_exact=run.resume_exact,
        resumed_count=decision.resumed_count,
        resumed_across=decision.resumed_across,
        tensorboard_dir=str(decision.tensorboard_dir) if decision.tensorboard_dir else None,
        wall_time_s=round(time.time() - run.started, 3),
        started_at=dt.datetime.fromtimestamp(run.started).isoformat(timespec="seconds"),
        torch_flags=stats.torch_flags,
        versions={
            "python": platform.python_version(),
            **{m.__name__: m.__version__ for m in (torch, L, hydra)},
        },
        git_commit=_git_commit(),
        **run.extra,
    )
    if run.fit_elsewhere:
        summary = _with_what_rank_zero_saw(summary, run)
    summary = dataclasses.replace(summary, diagnosis=doctor.diagnose(summary))  # what its numbers show
    run.write_summary_json(summary)
    return summary


def _with_what_rank_zero_saw(summary: Summary, run: Run) -> Summary:
    """This process's outcome of a forked fit on what forked rank 0 wrote (``ForkedRankZero``); an end
    rank 0 recorded itself (a hang, a lost rank) says more, and is kept whole."""
    path = run.dir / "summary.json"
    seen = Summary.load(path) if path.is_file() else None
    if seen is None or seen.started_at != summary.started_at:  # none of this start's
        return dataclasses.replace(summary, epochs=None, global_step=None)
    if seen.status != COMPLETED:
        return seen
    return dataclasses.replace(
        seen,
        status=summary.status,
        error=summary.error,
        metrics={**seen.metrics, **summary.metrics},
        checkpoints={**seen.checkpoints, **{k: v for k, v in summary.checkpoints.items() if v is not None}},
        wall_time_s=summary.wall_time_s,
        finished_at=summary.finished_at,
        oom=summary.oom,
    )


def _git_commit() -> str | None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, check=True).stdout

    try:
        commit, dirty = git("rev-parse", "HEAD").strip(), git("status", "--porcelain").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")
