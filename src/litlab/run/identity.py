"""A run's identity: the name its storage folder, its resume point and its lock are found by.

Nothing here imports torch: the preflight computes it to check the run's lock before torch loads.
"""

from __future__ import annotations

import hashlib

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

# Overrides that say where or how a run is launched, not what it is: not part of its identity.
_NOT_IDENTITY = (
    "hydra.",
    "resume",
    "run_name",
    "paths.",
    "storage.",
    "hydra/",
    "storage=",
)
NOT_IDENTITY = _NOT_IDENTITY  # also left out of an Optuna search's study name (litlab.launch.search)


def run_identity(cfg: DictConfig) -> str:
    """``run_name``, or the experiment name plus a hash of the overrides that define the run."""
    if cfg.run_name:
        return str(cfg.run_name)
    overrides = sorted(
        o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(_NOT_IDENTITY)
    )
    digest = hashlib.sha1("\n".join(overrides).encode()).hexdigest()[:10]
    return f"{cfg.experiment_name}-{digest}"
