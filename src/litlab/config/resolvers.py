"""The OmegaConf resolvers litlab's configs use (``litlab_*``), registered once per process before
composing: run and job folder names, start stamps, the environment, Optuna's direction, the Slurm
sizes, and ``litlab.config.usage``'s group list.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

from litlab.config import identity, usage
from litlab.config.rules import device_count
from litlab.logs import global_rank


def register() -> None:
    """Register every litlab resolver (idempotent)."""
    # submitit_local.yaml takes the plugin's own name on purpose (Hydra validates it against the
    # plugin's schema); the deprecation warning for such matching would print on every such multirun.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against")
    resolvers = {
        "litlab_cwd": _start_dir,
        "litlab_env": _env_or,
        "litlab_direction": lambda mode: {"min": "minimize"}.get(mode, "maximize"),
        "litlab_run_folder": _run_folder,
        "litlab_job_folder": _job_folder,
        "litlab_rank_zero_only": _rank_zero_only,
        "litlab_tasks_per_node": _tasks_per_node,
        "litlab_gpus_per_node": _gpus_per_node,
    }
    if not OmegaConf.has_resolver("litlab_start_stamp"):
        OmegaConf.register_new_resolver("litlab_start_stamp", _start_stamp, use_cache=True)
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    usage.register()


def _start_stamp() -> str:
    """``2026-12-02_01-02-03_0421a2b``: the start to the millisecond, then a random suffix (names sort
    as their runs started, and two starts never share one)."""
    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}_{now.microsecond // 1000:03d}{secrets.token_hex(2)}"


def _start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


def _env_or(name: str, default: Any) -> Any:
    """``${oc.env:NAME,default}``, but a variable set to nothing (as job templates often leave one)
    counts as unset: an empty ``LITLAB_LOG_DIR`` would put every run at the filesystem's root."""
    return os.environ.get(name) or default


def _run_folder(start_stamp: str, *, _root_: DictConfig) -> str:
    """``hydra.run.dir``'s last part: a training run's folder; the start stamp for litlab-eval's."""
    return identity.run_folder(_root_) if _is_training_run(_root_) else start_stamp


def _job_folder(number: int, run_dir: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: a training job's run folder (absolute: joined to the sweep's folder, it
    stays as it is); the job's number for what has no run identity."""
    return str(run_dir) if _is_training_run(_root_) else str(number)


def _is_training_run(cfg: DictConfig) -> bool:
    return "storage" in cfg  # litlab-train's config stores the run; litlab-eval's has no identity


def _rank_zero_only(value: Any) -> Any:
    """``value`` on global rank 0, None elsewhere (so ``hydra.output_subdir`` is written once)."""
    return value if global_rank() == 0 else None


def _tasks_per_node(devices: Any) -> int:
    """Slurm tasks per node for ``trainer.devices``: one task per device, each task one rank."""
    count = device_count(devices)
    if count is None:
        raise ValueError(
            f"trainer.devices={devices} cannot size a Slurm job: set trainer.devices to the number of "
            "devices (ranks) per node"
        )
    return count


def _gpus_per_node(accelerator: str, devices: Any) -> int | None:
    """GPUs per node: one per device for a GPU ``trainer.accelerator``, else None (none asked for)."""
    return _tasks_per_node(devices) if str(accelerator) in ("gpu", "cuda") else None
