"""Optuna's settings shared by the search (``litlab.launch.search``) and the pruning callback in each
trial's process (``litlab.callbacks.pruning``): the pruner, the study database's connection, and
``LITLAB_OPTUNA_TRIAL``, which tells a trial's process its study and trial. Optuna loads only when used.
"""

from __future__ import annotations

import json
import os
from typing import Any

from litlab.config.redact import redact_text
from litlab.config.rules import ConfigError
from litlab.errors import error_chain, first_line

TRIAL_ENV = "LITLAB_OPTUNA_TRIAL"  # a trial's study and trial (JSON), for pruning
_PRUNERS = ("median", "hyperband", "none")


def make_pruner(spec: dict[str, Any]) -> Any:
    """The pruner ``hydra.sweeper.pruner`` names, the same in the sweep and in every trial's process."""
    import optuna

    name = spec["name"]
    if name not in _PRUNERS:
        raise ConfigError(f"hydra.sweeper.pruner={name}: choose one of {', '.join(_PRUNERS)}")
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(spec.get("startup_trials", 5)),
            n_warmup_steps=int(spec.get("warmup_epochs", 0)),
        )
    if name == "hyperband":
        max_epochs = spec.get("max_epochs")
        return optuna.pruners.HyperbandPruner(
            min_resource=max(1, int(spec.get("warmup_epochs", 0)) + 1),
            max_resource=max_epochs if isinstance(max_epochs, int) and max_epochs > 0 else "auto",
        )
    return optuna.pruners.NopPruner()


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy's settings for the study's database: a pooled connection is checked before use (a
    restarted server's are replaced); PostgreSQL's connect gives up after 10 s, not the system's minutes."""
    timeout = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {}
    return {"pool_pre_ping": True, **timeout}


def database_error(error: BaseException) -> str:
    """What the database's driver said, in one line (``connection ... failed: Connection refused``),
    rather than Optuna's StorageInternalError, whose text blames the data."""
    said = next((cause.orig for cause in error_chain(error) if getattr(cause, "orig", None)), error)
    return redact_text(first_line(said))


def quiet_optuna() -> None:
    """litlab says what happens, once: no INFO lines from Optuna, and no warnings that heartbeats,
    retries and stale-trial checks are experimental (they have been since Optuna 2.8)."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings(
        "ignore", message="Heartbeat of storage is supposed to be used with Study.optimize"
    )


def trial_from_env() -> dict[str, Any] | None:
    """The trial this process trains (``LITLAB_OPTUNA_TRIAL``), or None outside a search."""
    text = os.environ.get(TRIAL_ENV)
    return json.loads(text) if text else None
