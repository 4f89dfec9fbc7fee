"""Config -> objects -> ``lightning.Trainer``: the one place that instantiates Trainer parts."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from typing import TYPE_CHECKING, Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.checkpoint import AtomicCheckpointIO
from litlab.callbacks.nonfinite import NonFiniteLossGuard
from litlab.callbacks.throughput import RunStats
from litlab.callbacks.world import WorldCheck
from litlab.data.memory import InMemoryImageDataModule
from litlab.errors import check_gpus_available, warn_about_setup
from litlab.logs import route_lightning_logs_to_root
from litlab.models.module import ClassifierModule
from litlab.resume import logger_arguments
from litlab.schema import BatchSizes, batch_sizes

if TYPE_CHECKING:
    from litlab.run import Run

log = logging.getLogger(__name__)
route_lightning_logs_to_root()


def _skip_nvml_probe_without_a_driver() -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 on import, so that asking whether CUDA is
    available never initialises CUDA (fork-started ranks need that). Where NVML cannot be loaded
    (no NVIDIA driver: CPU machines), torch then tries to dlopen libnvidia-ml on every
    ``torch.cuda.is_available()`` before falling back to the ordinary check, and torch's Adam and
    AdamW ask on every optimizer step: 86 us a step on a 2-core CPU (measured; 5% of a small
    model's step). Without a driver there is no CUDA to initialise, so the ordinary check is as safe.
    """
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1" or sys.platform != "linux":
        return
    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # what torch loads for the NVML check
    except OSError:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


_skip_nvml_probe_without_a_driver()


def build(cfg: DictConfig, run: Run) -> tuple[L.Trainer, ClassifierModule, InMemoryImageDataModule]:
    """The Trainer, module and datamodule of a run."""
    trainer = build_trainer(cfg, run)
    sizes = batch_sizes(cfg.data, cfg.trainer, world_size=trainer.world_size)
    run.batch_sizes = sizes
    data = build_datamodule(cfg.data, sizes.micro)
    module = build_module(cfg, total_steps=total_optimizer_steps(cfg, data, sizes))
    log.info(
        "batch: micro-batch %d x %d device(s) x %d node(s) x accumulation %d = effective batch %d",
        sizes.micro,
        trainer.num_devices,
        trainer.num_nodes,
        sizes.accumulation,
        sizes.effective,
    )
    return trainer, module, data


def build_datamodule(data_cfg: DictConfig, micro_batch_size: int) -> InMemoryImageDataModule:
    return instantiate(data_cfg, batch_size=micro_batch_size, _convert_="all")


def build_module(cfg: DictConfig, total_steps: int) -> ClassifierModule:
    net = instantiate(cfg.model.net, _convert_="all")
    if cfg.model.compile:
        import torch

        net = torch.compile(net)
    scheduler = cfg.scheduler
    return ClassifierModule(
        net=net,
        optimizer=instantiate(cfg.optimizer, _convert_="all"),
        num_classes=cfg.data.num_classes,
        total_steps=total_steps,
        scheduler=instantiate(scheduler.scheduler, _convert_="all") if "scheduler" in scheduler else None,
        scheduler_interval=scheduler.get("interval", "step"),
        scheduler_frequency=scheduler.get("frequency", 1),
        seed=cfg.seed,
        channels_last=cfg.model.channels_last,
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def total_optimizer_steps(cfg: DictConfig, data: InMemoryImageDataModule, sizes: BatchSizes) -> int:
    """Optimizer steps the run will take, for schedules (Lightning steps on an epoch's last batch)."""
    per_rank = math.ceil(data.num_train_samples / sizes.world_size)
    batches = math.ceil(per_rank / sizes.micro)
    limit = cfg.trainer.limit_train_batches
    if isinstance(limit, int):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = max(1, int(batches * limit))
    steps_per_epoch = math.ceil(batches / sizes.accumulation)
    max_steps, max_epochs = cfg.trainer.max_steps, cfg.trainer.max_epochs
    if max_epochs == -1:
        return max(1, max_steps)
    total = steps_per_epoch * max_epochs
    return min(total, max_steps) if max_steps > 0 else total


def build_trainer(cfg: DictConfig, run: Run) -> L.Trainer:
    loggers = build_loggers(cfg, run)
    callbacks = build_callbacks(cfg, run, has_logger=bool(loggers))
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_gpus_available(cfg.trainer)
    trainer = L.Trainer(
        **trainer_args,
        strategy=build_strategy(cfg.strategy),
        precision=cfg.precision.value,
        callbacks=callbacks,
        logger=loggers,
        # Lightning adds its own checkpoint callback and progress bar unless told there are none.
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
        default_root_dir=str(run.dir),
        plugins=[AtomicCheckpointIO()],  # a kill mid-write never leaves a truncated checkpoint
    )
    run.note_precision(requested=cfg.precision.value, effective=str(trainer.precision))
    warn_about_setup(cfg, trainer.world_size)
    return trainer


def build_strategy(strategy_cfg: DictConfig) -> Any:
    """A Lightning strategy object, or "auto". Every key but ``name`` is a constructor argument."""
    if strategy_cfg.get("_target_") is None:
        return "auto"
    args = {k: v for k, v in strategy_cfg.items() if k != "name"}
    return instantiate(OmegaConf.create(args), _convert_="all")


def build_callbacks(cfg: DictConfig, run: Run, has_logger: bool = True) -> list[Callback]:
    run.stats = RunStats()  # always on: summary.json and sweep reports need its figures
    nonfinite = NonFiniteLossGuard(cfg.on_nonfinite)  # always on: a nan loss must not go unnoticed
    run.extra["nonfinite"] = nonfinite.report
    world = WorldCheck()  # always on: a run never reports ranks it did not have
    run.extra["world"] = world.report
    callbacks: list[Callback] = [run.stats, nonfinite, world]
    for name, callback_cfg in cfg.callbacks.items():
        if callback_cfg is None:  # removed from the command line: callbacks.NAME=null
            continue
        target = callback_cfg.get("_target_", "")
        if target.endswith("LearningRateMonitor") and not has_logger:
            log.info("callback %s left out: it logs to a logger and logger=none", name)
            continue
        if target.endswith(("ModelCheckpoint", "run_checkpoints")):  # they write into the storage folder
            made = instantiate(callback_cfg, dirpath=run.checkpoint_dir)
        else:
            made = instantiate(callback_cfg, _convert_="all")
        callbacks.extend(made if isinstance(made, list) else [made])
        log.debug("callback %s: %s", name, made)
    return callbacks


def build_loggers(cfg: DictConfig, run: Run | None = None) -> list[Any] | bool:
    # logger_arguments: a resumed run's TensorBoard continues the run's log directory.
    loggers = [
        instantiate(c, **logger_arguments(c, run), _convert_="all")
        for c in cfg.logger.values()
        if c is not None
    ]
    return loggers or False
