"""The OmegaConf resolvers litlab's configs use, registered once per process before composing.

``litlab_run_folder`` (a run's folder name), ``litlab_job_folder`` (a sweep job's),
``litlab_start_stamp`` (a multirun's or an evaluation's directory name), ``litlab_cwd``, ``litlab_env``,
``litlab_direction`` (Optuna's direction), ``litlab_rank_zero_only``, the Slurm sizes
``litlab_tasks_per_node`` and ``litlab_gpus_per_node``, and ``litlab_config_groups`` of
``litlab.config.usage``.
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
    if not OmegaConf.has_resolver("litlab_start_stamp"):
        OmegaConf.register_new_resolver("litlab_start_stamp", start_stamp, use_cache=True)
    if not OmegaConf.has_resolver("litlab_cwd"):
        OmegaConf.register_new_resolver("litlab_cwd", start_dir)
    if not OmegaConf.has_resolver("litlab_env"):
        OmegaConf.register_new_resolver("litlab_env", env_or)
    if not OmegaConf.has_resolver("litlab_direction"):
        OmegaConf.register_new_resolver(
            "litlab_direction", lambda mode: {"min": "minimize"}.get(mode, "maximize")
        )
    # src/litlab/conf/hydra/launcher/submitit_local.yaml takes the plugin's own name on purpose, so Hydra
    # validates it against the plugin's schema of that name, and warns that such matching is
    # deprecated. The match is what we want; the warning would print on every such multirun.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against")
    launch_resolvers = {
        "litlab_run_folder": run_folder,
        "litlab_job_folder": job_folder,
        "litlab_rank_zero_only": rank_zero_only,
        "litlab_tasks_per_node": tasks_per_node,
        "litlab_gpus_per_node": gpus_per_node,
    }
    for name, resolver in launch_resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    usage.register()


def start_stamp() -> str:
    """``2026-12-02_01-02-03_0421a2b``: the start time to the millisecond, then a random suffix. Names
    sort as their runs started (two in one second included), and two starts never share one."""
    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}_{now.microsecond // 1000:03d}{secrets.token_hex(2)}"


def start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


def env_or(name: str, default: Any) -> Any:
    """``${oc.env:NAME,default}``, but a variable set to nothing (as job templates often leave one)
    counts as unset: an empty ``LITLAB_LOG_DIR`` would put every run at the filesystem's root."""
    return os.environ.get(name) or default


def run_folder(start_stamp: str, *, _root_: DictConfig) -> str:
    """``hydra.run.dir``'s last part: a training run's folder (``litlab.config.identity.run_folder``);
    ``start_stamp`` for what has no run identity (``litlab-eval``)."""
    return identity.run_folder(_root_) if _is_training_run(_root_) else start_stamp


def job_folder(number: int, run_dir: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: a training job's run folder (absolute: Hydra and the pool join it to
    the sweep's folder, which leaves it as it is); the job's number for what has no run identity."""
    return str(run_dir) if _is_training_run(_root_) else str(number)


def _is_training_run(cfg: DictConfig) -> bool:
    """A config with a run identity (litlab-train's: it stores the run); litlab-eval's has none."""
    return "storage" in cfg


def rank_zero_only(value: Any) -> Any:
    """``value`` on global rank 0, None elsewhere (so ``hydra.output_subdir`` is written once)."""
    return value if global_rank() == 0 else None


def tasks_per_node(devices: Any) -> int:
    """Slurm tasks per node for ``trainer.devices``: one task per device, each task one rank."""
    count = device_count(devices)
    if count is None:
        raise ValueError(
            f"trainer.devices={devices} cannot size a Slurm job: set trainer.devices to the number of "
            "devices (ranks) per node"
        )
    return count


def gpus_per_node(accelerator: str, devices: Any) -> int | None:
    """GPUs to request per node: one per device when ``trainer.accelerator`` is a GPU, else None
    (ask for none: the right thing on CPU-only partitions)."""
    return tasks_per_node(devices) if str(accelerator) in ("gpu", "cuda") else None
