"""The OmegaConf resolvers litlab's configs use, registered once per process before composing.

``litlab_start_stamp`` (a run's or multirun's directory name), ``litlab_cwd``, ``litlab_direction``
(Optuna's direction), ``litlab_run_stamp`` (the run directory's last part, the same on every rank),
``litlab_rank_zero_only``, the Slurm sizes ``litlab_tasks_per_node`` and ``litlab_gpus_per_node``, and
``litlab_config_groups`` of ``litlab.config.usage``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import secrets
import warnings
from typing import Any

from omegaconf import OmegaConf

from litlab.config import usage
from litlab.config.rules import device_count
from litlab.logs import global_rank
from litlab.torchrun import shares_agent_store, under_torchrun

log = logging.getLogger(__name__)


def register() -> None:
    """Register every litlab resolver (idempotent)."""
    if not OmegaConf.has_resolver("litlab_start_stamp"):
        OmegaConf.register_new_resolver("litlab_start_stamp", start_stamp, use_cache=True)
    if not OmegaConf.has_resolver("litlab_cwd"):
        OmegaConf.register_new_resolver("litlab_cwd", start_dir)
    if not OmegaConf.has_resolver("litlab_direction"):
        OmegaConf.register_new_resolver(
            "litlab_direction", lambda mode: {"min": "minimize"}.get(mode, "maximize")
        )
    # src/litlab/conf/hydra/launcher/submitit_local.yaml takes the plugin's own name on purpose, so Hydra
    # validates it against the plugin's schema of that name, and warns that such matching is
    # deprecated. The match is what we want; the warning would print on every such multirun.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against")
    launch_resolvers = {
        "litlab_run_stamp": run_stamp,
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


@functools.cache
def run_stamp(proposal: str) -> str:
    """The last part of the run directory, the same in every rank of one launch.

    ``proposal`` (timestamp + random suffix, resolved by this process) is used as it is when this
    process is the only rank, and under torchrun (``with_agreed_run_dir`` then pins the directory of
    global rank 0 for every rank). In a Slurm step of several tasks (``srun``) every task derives it
    from the job and step ids, which also keeps a requeued job in its run directory. For launchers
    litlab does not know, give every rank the same ``hydra.run.dir``.
    """
    if under_torchrun() and not shares_agent_store():
        # No shared store to agree through (e.g. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): the rendezvous id is.
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        if run_id != "none":
            return f"torchrun-{run_id}"
        log.warning(
            "torchrun without an agent store or --rdzv-id: each rank may write its own run directory; "
            "give every rank the same hydra.run.dir"
        )
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:  # inside `srun` with several tasks
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    return proposal


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
