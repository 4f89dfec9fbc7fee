"""What litlab adds to Lightning's loggers (litlab/conf/logger/): sweep grouping, final metrics, no
credentials, and one line for a missing package. Details: docs/loggers.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from litlab.config.redact import redact_text, url_without_userinfo
from litlab.errors import LitlabError, one_line
from litlab.run.summary import Summary

# Loggers whose package is an optional extra of litlab, of the same name: class name -> package.
_OPTIONAL_LOGGERS = {"MLFlowLogger": "mlflow", "WandbLogger": "wandb"}


def _logger_kind(logger_cfg: DictConfig) -> str:
    """The class name a logger config's ``_target_`` names (``MLFlowLogger``, ``WandbLogger``, ...)."""
    return str(logger_cfg.get("_target_", "")).rsplit(".", 1)[-1]


def grouping_arguments(
    logger_cfg: DictConfig, sweep: dict[str, Any] | None, run_dir: Path | None
) -> dict[str, Any]:
    """Constructor arguments that name the run and group a sweep's runs, where the config does not."""
    kind = _logger_kind(logger_cfg)
    name_argument = {"MLFlowLogger": "run_name", "WandbLogger": "name"}.get(kind)
    if name_argument is None:
        return {}
    sweep_name = Path(str(sweep["dir"])).name if sweep else None
    run_name = f"{sweep_name}/{sweep['job_num']}" if sweep else (run_dir.name if run_dir else None)
    arguments: dict[str, Any] = {name_argument: run_name} if logger_cfg.get(name_argument) is None else {}
    if sweep and kind == "MLFlowLogger":
        tags = OmegaConf.to_container(logger_cfg.tags, resolve=True) if logger_cfg.get("tags") else {}
        arguments["tags"] = {**tags, "sweep": sweep_name, "sweep_job": str(sweep["job_num"])}
    elif sweep and logger_cfg.get("group") is None:  # W&B
        arguments["group"] = sweep_name
    return arguments


def credential_arguments(logger_cfg: DictConfig) -> dict[str, Any]:
    """A logger's ``prefix`` and an MLflow ``tracking_uri`` without URL user-info, the credentials moved
    into the environment variables MLflow's client authenticates with (those already set win, as they
    do in MLflow; they stay set for this process and those it starts: DDP ranks, sweep jobs)."""
    prefix = logger_cfg.get("prefix")
    arguments = {"prefix": redact_text(prefix)} if isinstance(prefix, str) and "@" in prefix else {}
    if _logger_kind(logger_cfg) != "MLFlowLogger" or not logger_cfg.get("tracking_uri"):
        return arguments
    bare, username, password = url_without_userinfo(str(logger_cfg.tracking_uri))
    if username is None:
        return arguments
    for name, value in (("MLFLOW_TRACKING_USERNAME", username), ("MLFLOW_TRACKING_PASSWORD", password)):
        if value is not None and not os.environ.get(name):  # MLflow takes an empty one for none too
            os.environ[name] = value
    return {**arguments, "tracking_uri": bare}


class _RedactsHyperparameters:
    """Put before a logger class: every ``log_hyperparams`` (Lightning's of what ``save_hyperparameters``
    recorded, real values and all) passes ``redact_hyperparameters`` (set on the instance) first."""

    redact_hyperparameters: Callable[[Any], Any]

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> Any:
        return super().log_hyperparams(self.redact_hyperparameters(params), *args, **kwargs)


@functools.cache
def redacting_class(logger_class: type) -> type:
    """``logger_class`` with ``_RedactsHyperparameters`` in front, under its name (``isinstance`` holds)."""
    return type(
        logger_class.__name__,
        (_RedactsHyperparameters, logger_class),
        {"__module__": __name__, "__qualname__": logger_class.__qualname__},
    )


def missing_package(name: str, logger_cfg: DictConfig, error: BaseException) -> LitlabError:
    """The one line for a logger whose package is missing (Lightning raises ModuleNotFoundError)."""
    package = _OPTIONAL_LOGGERS.get(_logger_kind(logger_cfg))
    if package:
        fix = f"pip install 'litlab[{package}]' (or pip install {package})"
    else:
        fix = f"install the package it names ({one_line(error)})"
    return LitlabError(
        f"logger.{name} ({logger_cfg.get('_target_')}) needs a package that is not installed: {fix}"
    )


def check_wandb_login(logger_cfg: DictConfig) -> None:
    """An online W&B logger needs a login (without one, wandb.init fails inside fit or waits for a prompt)."""
    if _logger_kind(logger_cfg) != "WandbLogger" or logger_cfg.get("offline"):
        return
    import wandb
    from wandb.sdk import wandb_setup

    # wandb's own settings: the environment and its settings files (`wandb offline`); no service starts.
    if wandb_setup.singleton().settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not wandb.login(verify=False, prompt=False):  # reads WANDB_API_KEY, settings and ~/.netrc
        raise LitlabError(
            "logger=wandb needs a W&B login: run `wandb login` (or set WANDB_API_KEY), or set "
            "WANDB_MODE=offline to keep the runs on this machine (`wandb sync` uploads them later)"
        )


def log_final_metrics(loggers: list[Any], summary: Summary, is_global_zero: bool) -> None:
    """The summary's metrics as ``final/<name>`` in every logger; W&B runs are then finished, so that
    the next run in this process (a sweep's next job) starts its own."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    final = {f"final/{name}": value for name, value in summary.metrics.items()}
    choices = {
        **{f"group/{k}": v for k, v in summary.groups.items()},
        "effective_batch_size": summary.effective_batch_size,
        "accumulate_grad_batches": summary.accumulate_grad_batches,
        "precision_effective": summary.precision.get("effective"),
    }
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):  # its HParams tab compares runs by these
            # Under their own names: Lightning writes these at step 0, which under the metrics' own
            # names put a point with the final value at the start of every val/ and test/ curve.
            logger.log_hyperparams(choices, metrics=final)
        else:
            logger.log_metrics(final, step=summary.global_step)
        if isinstance(logger, WandbLogger) and is_global_zero:
            logger.experiment.summary.update(final)
            logger.experiment.finish()
            continue
        # Fit and test have already finalized the loggers; this reopened them (TensorBoard's writer: an
        # unflushed event file can lose these at exit; MLflow's run: its end time).
        logger.finalize("success")
