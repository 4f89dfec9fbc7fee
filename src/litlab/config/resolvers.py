"""The OmegaConf resolvers litlab's configs use (``litlab_*``), registered once per process before
composing: run and job folder names, start stamps, the environment, Optuna's direction, the Slurm
sizes, and the config groups that ``--help`` lists.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import sys
import warnings
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from litlab.config import identity
from litlab.config.rules import device_count
from litlab.logs import global_rank


def register() -> None:
    """Register every litlab resolver (idempotent)."""
    # submitit_local.yaml takes the plugin's own name on purpose (Hydra validates it against the
    # plugin's schema); the deprecation warning for such matching would print on every such multirun.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against")
    resolvers = {
        "litlab_cwd": _start_dir,
        # ${oc.env:NAME,default}, but a variable set to nothing (as job templates often leave one)
        # counts as unset: an empty LITLAB_LOG_DIR would put every run at the filesystem's root.
        "litlab_env": lambda name, default: os.environ.get(name) or default,
        "litlab_direction": lambda mode: {"min": "minimize"}.get(mode, "maximize"),
        "litlab_run_folder": _run_folder,
        "litlab_job_folder": _job_folder,
        # On global rank 0 only, None elsewhere (so hydra.output_subdir is written once).
        "litlab_rank_zero_only": lambda value: value if global_rank() == 0 else None,
        "litlab_tasks_per_node": _tasks_per_node,
        "litlab_config_groups": _config_groups,  # Hydra's help templates (src/litlab/conf/hydra/help/)
        # GPUs per node: one per device for a GPU trainer.accelerator, else None (none asked for).
        "litlab_gpus_per_node": lambda accelerator, devices: (
            _tasks_per_node(devices) if str(accelerator) in ("gpu", "cuda") else None
        ),
    }
    if not OmegaConf.has_resolver("litlab_start_stamp"):
        OmegaConf.register_new_resolver("litlab_start_stamp", _start_stamp, use_cache=True)
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def _start_stamp() -> str:
    """``2026-12-02_01-02-03_0421a2b``: the start to the millisecond, then a random suffix (names sort
    as their runs started, and two starts never share one)."""
    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}_{now.microsecond // 1000:03d}{secrets.token_hex(2)}"


def _start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


# litlab-train's config has storage (a run identity); litlab-eval's has none.
def _run_folder(start_stamp: str, *, _root_: DictConfig) -> str:
    """``hydra.run.dir``'s last part: a training run's folder; the start stamp for litlab-eval's."""
    return identity.run_folder(_root_) if "storage" in _root_ else start_stamp


def _job_folder(number: int, run_dir: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: a training job's run folder (absolute: joined to the sweep's folder, it
    stays as it is); the job's number for what has no run identity."""
    return str(run_dir) if "storage" in _root_ else str(number)


def _tasks_per_node(devices: Any) -> int:
    """Slurm tasks per node for ``trainer.devices``: one task per device, each task one rank."""
    count = device_count(devices)
    if count is None:
        raise ValueError(
            f"trainer.devices={devices} cannot size a Slurm job: set trainer.devices to the number of "
            "devices (ranks) per node"
        )
    return count


# Groups in the order a user thinks of them: what runs, how it trains, where it goes, what it sweeps.
_ORDER = ["data", "model", "optimizer", "scheduler", "experiment", "trainer", "precision", "strategy"]
_ORDER += ["callbacks", "logger", "storage", "oom", "debug", "sweep", "hparams_search", "hydra/launcher"]
_NOT_PICKED = ("schema", "paths", "local", "hydra")


def _config_groups() -> str:
    """The groups a user picks with ``GROUP=OPTION``, one line each with its options from the search
    path (the chosen one marked ``*``); empty unless the command line asks for ``--help``: omegaconf
    resolves the template in every compose, and listing the groups was most of a compose's time."""
    if not any(arg in ("--help", "-h") for arg in sys.argv[1:]):  # Hydra reads the same sys.argv
        return ""
    hydra = GlobalHydra.instance().hydra
    if hydra is None:
        return ""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    every = hydra.list_all_config_groups()
    groups = [g for g in every if g == "hydra/launcher" or g.split("/")[0] not in _NOT_PICKED]
    groups.sort(key=lambda group: (_ORDER.index(group) if group in _ORDER else len(_ORDER), group))
    width = max((len(group) for group in groups), default=0)
    lines = []
    for group in groups:
        options = sorted(hydra.config_loader.get_group_options(group))
        marked = [f"{o}*" if o == choices.get(group) else o for o in options]
        lines.append(f"  {group:<{width}}  {', '.join(marked)}")
    return "\n".join(lines)
