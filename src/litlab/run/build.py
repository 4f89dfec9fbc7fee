"""Config -> objects -> ``lightning.Trainer``: the one place that instantiates a run's parts
(docs/contract.md). A part that raises while it is built ends the run in one line (``PartRefused``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.combined import combine
from litlab.callbacks.loader_state import ResumableLoaderCheck
from litlab.callbacks.logger_runs import LoggerRuns
from litlab.callbacks.model_summary import ModelSummaryWithMeasuredFlops
from litlab.callbacks.nonfinite import NonFiniteLossGuard
from litlab.callbacks.pruning import TrialPruning
from litlab.callbacks.run_stats import RunStats
from litlab.callbacks.world import WorldCheck
from litlab.config.identity import once
from litlab.config.pruners import trial_from_env
from litlab.config.redact import Redaction
from litlab.config.rules import ConfigError, batch_sizes
from litlab.data.tensor_batches import ReseedEveryStep, WholeGlobalBatches
from litlab.errors import LitlabError, first_line, one_line, warn_about_setup
from litlab.logs import route_lightning_logs_to_root
from litlab.run.combinations import check_combination, trainer_errors
from litlab.run.hangs import HeartbeatAfterYourCallbacks, RankWatch
from litlab.run.lifecycle import ForkedRankZero, Run, write_summary
from litlab.run.loggers import (
    check_wandb_login,
    credential_arguments,
    grouping_arguments,
    missing_package,
    redacting_class,
)
from litlab.run.summary import Summary, sweep_job
from litlab.storage.checkpoints import AtomicCheckpointIO, RunConfigInCheckpoint
from litlab.storage.resume import logger_arguments
from litlab.torchrun import join_restarted_torchrun_group

log = logging.getLogger(__name__)
route_lightning_logs_to_root()


# Without an NVIDIA driver, Lightning's PYTORCH_NVML_BASED_CUDA_CHECK=1 makes torch dlopen NVML on every
# torch.cuda.is_available(), which Adam asks each step (docs/performance.md); with no CUDA to initialise,
# the ordinary check is as safe.
if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1" and sys.platform == "linux":
    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # what torch loads for the NVML check
    except OSError:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


class PartRefused(LitlabError):
    """A configured part (logger, strategy, callback, profiler) raised while it was built."""


def build(cfg: DictConfig, run: Run) -> tuple[L.Trainer, L.LightningModule, L.LightningDataModule]:
    """The Trainer, module and datamodule of a run."""
    try:
        trainer = build_trainer(cfg, run)
    except PartRefused as refused:  # ended before its Trainer existed: a `failed` summary.json all the same
        if run.is_global_zero:
            run.write_summary_json(
                Summary.of(cfg, refused.reason, run_dir=run.dir, hydra=HydraConfig.get(), sweep=sweep_job())
            )
        raise
    sizes = batch_sizes(cfg.data, cfg.trainer, trainer.world_size, cfg.global_batch_size)
    run.batch_sizes = sizes
    data = build_datamodule(cfg, sizes.micro)
    module = build_module(cfg)
    log.info(
        f"batch: micro-batch {sizes.micro} x {trainer.num_devices} device(s) x {trainer.num_nodes} node(s) x "
        f"accumulation {sizes.accumulation} = effective batch {sizes.effective}"
        if sizes.micro
        else f"batch: data={_choice('data')} has no batch_size: its datamodule sizes its own batches, so "
        "summary.json has no micro-batch nor effective batch (docs/contract.md)"
    )
    if cfg.optimized_metric is None:
        log.info("optimized_metric=null: checkpoints keep the last epoch's, not the best by a metric")
    return trainer, module, data


def build_datamodule(cfg: DictConfig, micro_batch_size: int | None) -> L.LightningDataModule:
    """Your ``data._target_``, with ``batch_size`` = the micro-batch where there is one."""
    sized = {} if micro_batch_size is None else {"batch_size": micro_batch_size}
    return _instantiate("data", cfg.data, L.LightningDataModule, **sized)


def build_module(cfg: DictConfig) -> L.LightningModule:
    """Your ``model._target_``; with ``compile=true`` its ``forward`` compiled (what ``self(...)`` runs)."""
    module = _instantiate(
        "model", cfg.model, L.LightningModule, hint=" (a network goes inside it, e.g. model.net)"
    )
    _configure_optimizers_in_one_line(module)
    if cfg.compile:
        import torch

        # Not torch.compile(module) nor module.compile(): Lightning would compile the step methods too,
        # whose torchmetrics and self.log calls dynamo fails on; the forward keeps the weights' names.
        module.forward = torch.compile(module.forward)
    return module


def _configure_optimizers_in_one_line(module: L.LightningModule) -> None:
    """An error in your ``configure_optimizers`` as one line naming the class and your line of code."""
    if not is_overridden("configure_optimizers", module, L.LightningModule):
        return
    configure, name = module.configure_optimizers, type(module).__name__
    package = Path(sys.modules[type(module).__module__.split(".")[0]].__file__ or "").parent

    def configure_optimizers() -> Any:
        try:
            return configure()
        except Exception as error:
            mine = [
                f for f in traceback.extract_tb(error.__traceback__) if package in Path(f.filename).parents
            ]
            where = f" at {Path(mine[-1].filename).name}:{mine[-1].lineno} `{mine[-1].line}`" if mine else ""
            if "object is not callable" in str(error):  # the optimizer's config called as a partial
                where += (
                    ": with _recursive_: false the optimizer arrives as config, which hydra.utils."
                    "instantiate(self.hparams.optimizer)(self.parameters()) builds (docs/your-task.md)"
                )
            raise LitlabError(
                f"{name}.configure_optimizers raised {type(error).__name__}: {first_line(error)}{where}"
            ) from error

    module.configure_optimizers = configure_optimizers  # the instance's: Lightning calls it as the hook


def check_by_building(cfg: DictConfig) -> None:
    """Build what is cheap, as the run will (the accelerator x strategy check, the datamodule, the optimizer
    partial on one parameter); a ConfigError names the rejected setting. Not the module: a large network
    would be built twice."""
    import torch

    sizes = batch_sizes(cfg.data, cfg.trainer, global_batch=cfg.global_batch_size)
    try:
        _check_combination(cfg)
        build_datamodule(cfg, sizes.micro)
        optimizer = _instantiate("optimizer", cfg.optimizer)
        if callable(optimizer):
            try:
                optimizer([torch.nn.Parameter(torch.zeros(1))])
            except (ValueError, TypeError) as error:
                settings = " ".join(
                    f"{k}={v}" for k, v in cfg.optimizer.items() if not str(k).startswith("_")
                )
                raise ConfigError(
                    f"optimizer={_choice('optimizer')} ({cfg.optimizer.get('_target_')}) rejects its "
                    f"settings {settings}: {one_line(error)}"
                ) from None
    except LitlabError as error:
        raise ConfigError(error.reason) from None


def _instantiate(
    group: str, node: DictConfig, kind: type | None = None, hint: str = "", **kwargs: Any
) -> Any:
    """``hydra.utils.instantiate``; a rejected argument, or an object not of ``kind``: one line."""
    try:
        made = instantiate(node, **kwargs, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__ or error
        if isinstance(cause, (ValueError, TypeError, OSError, ImportError)):
            raise LitlabError(f"{group}={_choice(group)}: {one_line(cause)}") from error
        raise
    if kind is not None and not isinstance(made, kind):
        raise LitlabError(
            f"{group}={_choice(group)} builds a {type(made).__name__}, not a {kind.__name__}: point "
            f"{group}._target_ at your {kind.__name__} class{hint}"
        )
    return made


def _choice(group: str) -> str:
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    return str(choices.get(group, "?"))


class NoProfiler(PassThroughProfiler):
    """PassThroughProfiler without a generator-based context around every hook call (docs/performance.md)."""

    _nothing = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return self._nothing


@contextlib.contextmanager
def refused_in_one_line(part: str, target: Any, settings: Any = None) -> Iterator[None]:
    """What a part raises while it is built, as one line naming the part, its class and the reason."""
    try:
        yield
    except LitlabError:
        raise
    except Exception as error:
        cause = error.__cause__ if isinstance(error, InstantiationException) and error.__cause__ else error
        log.debug("%s refused to build", part, exc_info=cause)
        target, reason = str(target or ""), f"{type(cause).__name__}: {one_line(cause)}"
        said = f"{target.rsplit('.', 1)[-1] or 'it'} refused to start: {reason}"
        if target.endswith("MLFlowLogger") and "file" in reason.lower() and "store" in reason.lower():
            import mlflow

            uri = (settings or {}).get("tracking_uri") or mlflow.get_tracking_uri()
            said = (
                f"MLflow refuses the tracking URI {uri}: {reason} (set "
                "MLFLOW_TRACKING_URI=sqlite:///PATH/mlflow.db, or unset it for litlab's own "
                "sqlite:///<log dir>/mlflow.db, or set MLFLOW_ALLOW_FILE_STORE=true)"
            )
        raise PartRefused(f"{part}: {said}") from error


def _build_profiler(name: str | None) -> Any:
    """Lightning's profiler of that name (built here: one that cannot start is said in one line), or none."""
    if not name:
        return NoProfiler()
    from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler, XLAProfiler

    kinds = dict(simple=SimpleProfiler, advanced=AdvancedProfiler, pytorch=PyTorchProfiler, xla=XLAProfiler)
    kind = kinds.get(str(name).lower())
    if kind is None:
        return name  # Lightning's own error names the allowed values
    with refused_in_one_line(f"trainer.profiler={name}", f"{kind.__module__}.{kind.__name__}"):
        return kind()


def _check_combination(cfg: DictConfig) -> None:
    """Once a start: in the preflight, and in ``build_trainer`` for a job started without one (submitit's)."""
    pair = [OmegaConf.to_container(cfg[group], resolve=False) for group in ("trainer", "strategy")]
    once("combination", pair, lambda: check_combination(cfg.trainer, cfg.strategy))


def build_trainer(cfg: DictConfig, run: Run) -> L.Trainer:
    redaction = Redaction.of(cfg)
    _check_combination(cfg)  # no such GPU, FSDP on a CPU: one line, not a traceback
    loggers = build_loggers(cfg, run, redaction)
    callbacks = build_callbacks(cfg, run, bool(loggers), redaction)
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_args["profiler"] = _build_profiler(trainer_args.get("profiler"))  # simple, advanced, pytorch
    # The engine adds its own model summary (build_callbacks); Lightning's would be a second one.
    trainer_args["enable_model_summary"] = False
    with trainer_errors(cfg.trainer, cfg.strategy, cfg.precision):
        trainer = L.Trainer(
            **trainer_args,
            strategy=build_strategy(cfg.strategy),
            precision=cfg.precision.value,
            callbacks=callbacks,
            logger=loggers,
            # Lightning adds its own checkpoint callback and progress bar unless told there are none.
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
            enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),  # a RichProgressBar
            default_root_dir=str(run.dir),
            plugins=[AtomicCheckpointIO()],  # a kill or a full disk mid-write never truncates a checkpoint
        )
    run.note_precision(requested=cfg.precision.value, effective=str(trainer.precision))
    # Lightning's launcher for notebooks forks the ranks from here (none under torchrun or Slurm).
    run.forks_ranks = bool(trainer.strategy.launcher and trainer.strategy.launcher.is_interactive_compatible)
    warn_about_setup(cfg, trainer.world_size)
    join_restarted_torchrun_group(trainer)  # works around stale addresses in torchrun's store
    return trainer


def build_strategy(strategy_cfg: DictConfig) -> Any:
    """A Lightning strategy object, or "auto". Every key but ``name`` is a constructor argument."""
    if strategy_cfg.get("_target_") is None:
        return "auto"
    args = {k: v for k, v in strategy_cfg.items() if k != "name"}
    with refused_in_one_line(f"strategy={strategy_cfg.name}", strategy_cfg.get("_target_")):
        return instantiate(OmegaConf.create(args), _convert_="all")


def build_callbacks(
    cfg: DictConfig, run: Run, has_logger: bool = True, redaction: Redaction | None = None
) -> list[Callback]:
    """The engine's callbacks, which every run has, and the ``callbacks`` group's, combined into one."""
    redaction = redaction or Redaction.of(cfg)
    # A failed, dead or stuck rank ends the run on every rank; a SIGTERM stops every rank at one step.
    watch = RankWatch(cfg, run, record_failure=functools.partial(write_summary, cfg, run=run))
    # No nan loss goes unnoticed; the ranks' agreement on one carries the watch's stop flags.
    nonfinite = NonFiniteLossGuard(cfg.on_nonfinite, rider=watch)
    # Throughput, history and input wait for summary.json.
    stats = run.stats = RunStats(cfg.optimized_metric, skips=nonfinite.report)
    world = WorldCheck()  # a run never reports ranks it did not have
    run.extra.update(
        nonfinite=nonfinite.report, world=world.report, history=stats.history, input_wait=stats.input_wait
    )
    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    callbacks = [
        stats,
        nonfinite,
        world,
        ReseedEveryStep(cfg.seed),
        WholeGlobalBatches(),  # every optimizer step trains on a whole global batch
        ResumableLoaderCheck(run),  # resume is exact, or summary.json says it is not
        # litlab-eval rebuilds the run from a checkpoint's config: redacted, as all that leaves the process.
        RunConfigInCheckpoint(redaction.config, choices, redact_values=redaction.values),
        watch,
        LoggerRuns(redaction.config),  # the resolved config, redacted, as the loggers' parameters
    ]
    if cfg.strategy.get("start_method") == "fork":  # ddp_notebook: what only forked rank 0 sees
        callbacks.append(ForkedRankZero(cfg, run))
    if cfg.trainer.get("enable_model_summary") is not False:  # on unless false, as in Lightning
        callbacks.append(ModelSummaryWithMeasuredFlops())
    if (trial := trial_from_env()) is not None:  # an Optuna trial: reports, and stops when pruned
        callbacks.append(TrialPruning(cfg.optimized_metric, trial, run))
    for name, callback_cfg in cfg.callbacks.items():
        if callback_cfg is None:  # removed from the command line: callbacks.NAME=null
            continue
        target = callback_cfg.get("_target_", "")
        if target.endswith("LearningRateMonitor") and not has_logger:
            log.info("callback %s left out: it logs to a logger and logger=none", name)
            continue
        with refused_in_one_line(f"callbacks.{name}", target):
            if target.endswith(("ModelCheckpoint", "run_checkpoints")):  # they write into the storage folder
                made = instantiate(callback_cfg, dirpath=run.checkpoint_dir)
            else:
                made = instantiate(callback_cfg, _convert_="all")
        callbacks.extend(made if isinstance(made, list) else [made])
        log.debug("callback %s: %s", name, made)
    callbacks.append(HeartbeatAfterYourCallbacks(watch))  # after yours, before the checkpoints
    return combine(callbacks)


def build_loggers(
    cfg: DictConfig, run: Run | None = None, redaction: Redaction | None = None
) -> list[Any] | bool:
    """The ``logger`` group's loggers, each logging its hyperparameters redacted (``redacting_class``):
    what ``save_hyperparameters`` recorded holds the real values."""
    redact = (redaction or Redaction.of(cfg)).values
    loggers = []
    sweep = sweep_job() if HydraConfig.initialized() else None
    for name, logger_cfg in cfg.logger.items():
        if logger_cfg is None:  # removed from the command line: logger.NAME=null
            continue
        # A resumed run's TensorBoard continues its log directory; a sweep's MLflow and W&B runs are
        # grouped by the sweep; MLflow's tracking URI loses its user-info (credentials go by environment).
        arguments = {
            **logger_arguments(logger_cfg, run),
            **grouping_arguments(logger_cfg, sweep, run.dir if run else None),
            **credential_arguments(logger_cfg),
        }
        choice = _choice("logger")  # logger=mlflow, or logger=many (logger.mlflow)
        part = f"logger={name}" if choice == name else f"logger={choice} (logger.{name})"
        with refused_in_one_line(part, logger_cfg.get("_target_"), logger_cfg):
            try:  # an ImportError: the target's module, or Lightning's check for an optional package
                made = instantiate(logger_cfg, **arguments, _convert_="all", _partial_=True)
                if not isinstance(made.func, type):
                    raise LitlabError(
                        f"logger.{name}: _target_ {logger_cfg.get('_target_')} is not a class: name a logger "
                        "class (litlab subclasses it, so that its hyperparameters reach it redacted)"
                    )
                logger = redacting_class(made.func)(*made.args, **made.keywords)
            except (ImportError, InstantiationException) as error:
                missing = error.__cause__ if isinstance(error, InstantiationException) else error
                if not isinstance(missing, ImportError):
                    raise
                raise missing_package(name, logger_cfg, missing) from None
            logger.redact_hyperparameters = redact
            loggers.append(logger)
        check_wandb_login(logger_cfg)  # before fit, where wandb.init would fail with a traceback
    return loggers or False
