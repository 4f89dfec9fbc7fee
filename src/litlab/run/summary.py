"""summary.json, the one record of a run's outcome: ``Summary`` defines it, ``Summary.of`` builds it and
``Summary.write`` writes it (atomic, redacted). Fields: docs/runs.md. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"
PRUNED = "pruned"  # an Optuna trial stopped early by its pruner
RUNNING_ELSEWHERE = "running elsewhere"  # a sweep's job whose run another process was training
# A sweep's job as its record has it before it ends (litlab.run.sweep_record): planned, or started.
NOT_STARTED, RUNNING = "not started", "running"
# Groups that are not settings of a run: Hydra's own, the schemas, and what picks a sweep's jobs.
_NOT_RUN_GROUPS = ("hydra", "schema")

# The single-run child of a sweep job's place in its sweep, as JSON (its ranks inherit it).
SWEEP_JOB_ENV = "LITLAB_SWEEP_JOB"


@dataclass
class Summary:
    status: str  # COMPLETED, FAILED, INTERRUPTED (SIGTERM) or PRUNED
    error: str | None = None
    pruned_epoch: int | None = None  # the epoch whose validation made the pruner stop the trial
    experiment_name: str | None = None
    run_name: str | None = None  # the run identity (resume finds its storage folder by it)
    run_dir: str | None = None
    storage_dir: str | None = None
    groups: dict[str, Any] = field(default_factory=dict)  # the option chosen in each config group
    overrides: list[str] = field(default_factory=list)  # the command line's
    optimized_metric: str | None = None
    optimized_metric_mode: str | None = None  # "min" or "max"
    precision: dict[str, Any] = field(default_factory=dict)  # requested, effective
    accelerator: str | None = None
    strategy: str | None = None
    devices: int | None = None
    num_nodes: int | None = None
    world_size: int | None = None
    cluster_environment: str | None = None  # who started the ranks, as Lightning saw it
    micro_batch_size: int | None = None
    accumulate_grad_batches: int | None = None
    effective_batch_size: int | None = None
    global_batch_size: int | None = None
    epochs: int | None = None
    global_step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    throughput: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] | None = None
    checkpoints: dict[str, Any] = field(default_factory=dict)  # dir, best, last, tested
    resume_exact: bool | None = None  # false when a train loader cannot restore its position
    resumed_count: int = 0
    tensorboard_dir: str | None = None  # the run's TensorBoard curves: a resumed run continues its first's
    wall_time_s: float | None = None
    started_at: str | None = None
    finished_at: str | None = None
    sweep: dict[str, Any] | None = None  # a multirun job's place: dir, job_num
    world: dict[str, Any] | None = None  # the process group and steps per rank, checked after fit
    torch_flags: dict[str, Any] | None = None  # process-wide torch settings while training
    nonfinite: dict[str, Any] | None = None
    oom: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None  # one entry per training epoch
    input_wait: dict[str, Any] | None = None  # time between training steps waiting for the next batch
    device_memory_mib: float | None = None  # memory of one CUDA device, for the doctor's batch check
    diagnosis: list[dict[str, Any]] | None = None  # what litlab.run.doctor found in the run's numbers
    versions: dict[str, str] = field(default_factory=dict)
    git_commit: str | None = None
    code_fingerprint: str | None = None  # the user's code and configs (litlab.config.identity.code_version)
    settings: dict[str, Any] | None = None  # what the run trains (run_settings): reports group runs by it
    resumed_across: list[str] = field(default_factory=list)  # e.g. ["code 8373778d→c6928336"]

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        from litlab.config.redact import redact_summary  # every written summary: no credentials

        return json.dumps(redact_summary(self.to_dict()), indent=2, default=str) + "\n"

    def write(self, path: Path) -> None:
        """The one way a summary reaches a file: redacted, and atomic (never half a summary)."""
        from litlab.storage.roots import write_text_atomic

        write_text_atomic(path, self.to_json())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """A summary from its JSON form; fields this version does not know are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def load(cls, path: Path) -> Summary:
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def of(
        cls,
        cfg: DictConfig,
        error: str | None,
        *,
        run_dir: Path | str | None,
        hydra: DictConfig | None,
        status: str = FAILED,
        **known: Any,
    ) -> Summary:
        """What the config and Hydra node (``hydra``, or None) say of a run, under what its Trainer knows."""
        from litlab.config.identity import run_identity, run_settings
        from litlab.config.redact import typed_overrides
        from litlab.config.rules import ConfigError, batch_sizes, device_count

        hydra = hydra if hydra is not None else OmegaConf.create()

        def select(key: str) -> Any:
            value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
            return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value

        try:
            sizes = batch_sizes(cfg.data, cfg.trainer, global_batch=select("global_batch_size"))
        except (ConfigError, AttributeError, TypeError, KeyError):
            sizes = None
        devices = device_count(select("trainer.devices"))
        nodes = select("trainer.num_nodes")
        # The run's identity from its settings: its attempts are one run (a run knows both already).
        settings = known["settings"] if "settings" in known else run_settings(cfg) or None
        identity = settings and "run_name" in cfg and "run_name" not in known
        choices = OmegaConf.select(hydra, "runtime.choices", default=None) or {}
        from_config = dict(
            experiment_name=select("experiment_name"),
            run_name=run_identity(cfg, settings) if identity else select("run_name"),
            run_dir=str(run_dir) if run_dir is not None else None,
            groups={k: v for k, v in choices.items() if not str(k).startswith(_NOT_RUN_GROUPS)},
            overrides=typed_overrides(OmegaConf.select(hydra, "overrides.task", default=None) or []),
            optimized_metric=select("optimized_metric"),
            optimized_metric_mode=select("optimized_metric_mode"),
            precision={"requested": select("precision.value"), "effective": None},
            accelerator=select("trainer.accelerator"),
            strategy=select("strategy.name"),
            devices=devices if devices is not None else select("trainer.devices"),
            num_nodes=nodes,
            world_size=devices * nodes if devices and isinstance(nodes, int) else None,
            micro_batch_size=sizes.micro if sizes else select("data.batch_size"),
            accumulate_grad_batches=select("trainer.accumulate_grad_batches"),
            effective_batch_size=sizes.effective if sizes else None,
            global_batch_size=select("global_batch_size"),
            finished_at=now(),
            settings=settings,
        )
        return cls(status=status, error=error, **{**from_config, **known})


def finite(value: Any) -> bool:
    """A number that is neither nan nor inf (a metric worth comparing)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def sweep_job() -> dict[str, Any] | None:
    """This run's place in a sweep (``dir``, ``job_num``; under the Slurm, submitit and joblib
    launchers also ``command``), or None outside a multirun."""
    inherited = os.environ.get(SWEEP_JOB_ENV)
    if inherited:  # the job's own process (and its ranks)
        return json.loads(inherited)
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:  # a launcher's process that runs the job's command
        return {"dir": hydra.sweep.dir, "job_num": hydra.job.num}
    return None
