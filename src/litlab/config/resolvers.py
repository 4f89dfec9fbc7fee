"""The OmegaConf resolvers litlab's configs use (registered once per process, before composing).

- ``${litlab_uid:}``: a short random id, fixed for the process, for run directory names;
- ``${litlab_cwd:}``: the directory litlab was started from (``paths.root_dir``);
- ``${litlab_direction:MODE}``: Optuna's direction (maximize, minimize) for optimized_metric_mode;
- the launch resolvers of ``litlab.launch.ranks`` (one run directory for all ranks, Slurm sizes);
- ``${litlab_config_groups:}`` of ``litlab.cli.usage``: the groups ``--help`` lists.
"""

from __future__ import annotations

import os
import secrets

from omegaconf import OmegaConf


def register() -> None:
    """Register every litlab resolver (idempotent)."""
    from litlab.cli import usage
    from litlab.launch import ranks

    if not OmegaConf.has_resolver("litlab_uid"):
        OmegaConf.register_new_resolver("litlab_uid", lambda: secrets.token_hex(3), use_cache=True)
    if not OmegaConf.has_resolver("litlab_cwd"):
        OmegaConf.register_new_resolver("litlab_cwd", start_dir)
    if not OmegaConf.has_resolver("litlab_direction"):
        OmegaConf.register_new_resolver(
            "litlab_direction", lambda mode: {"min": "minimize"}.get(mode, "maximize")
        )
    ranks.register()
    usage.register()


def start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()
