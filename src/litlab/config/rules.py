"""Rules of a config that types cannot express, and the batch sizes they imply.

``check`` (train) and ``check_eval`` raise ``ConfigError``: one sentence naming the key, the bad
value and what is allowed. Nothing here imports torch: the preflight runs these before it loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

PRECISION_VALUES = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")  # Lightning's accelerator names
NONFINITE_ACTIONS = ("fail", "skip")
OOM_ACTIONS = ("fail", "auto_shrink")
TUNE_MODES = ("power", "binsearch")
METRIC_MODES = ("min", "max")


class ConfigError(ValueError):
    """A config value that is well-typed but not allowed; the message is one sentence."""


@dataclass(frozen=True)
class BatchSizes:
    micro: int | None  # per device per optimizer step (data.batch_size); None: the datamodule's own
    accumulation: int
    world_size: int  # devices x nodes
    effective: int | None  # samples per optimizer step across all ranks; None where micro is


def device_count(devices: Any) -> int | None:
    """Processes per node asked for by ``trainer.devices``; None for "auto" (known only later) and
    where there is no such key."""
    if devices is None or isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, str):
        if devices.strip().isdigit():
            return int(devices)
        if "," in devices:
            return len([d for d in devices.split(",") if d.strip()])
        return None
    return len(devices)  # a list of device indices


def batch_sizes(
    data: DictConfig, trainer: DictConfig, world_size: int | None = None, global_batch: int | None = None
) -> BatchSizes:
    """The micro-batch and effective batch of a run; derives the micro-batch from ``global_batch``
    (the config's top-level ``global_batch_size``) when that is set."""
    nodes = trainer.get("num_nodes", 1)  # a key the trainer YAML leaves out has Lightning's default
    if world_size is None:
        world_size = (device_count(trainer.get("devices", "auto")) or 1) * nodes
    accumulation = trainer.get("accumulate_grad_batches", 1)
    micro = data.get("batch_size")  # None: a datamodule that fixes its batches itself
    _positive("trainer.accumulate_grad_batches", accumulation)  # "02" from a sweep is a string: no 0202
    if global_batch is not None:
        _needs_batch_size(data, f"global_batch_size={global_batch}", "sets the micro-batch it derives")
        per_step = world_size * accumulation
        if global_batch % per_step != 0:
            raise ConfigError(
                f"global_batch_size={global_batch} does not divide into "
                f"devices x num_nodes x accumulate_grad_batches = {world_size} x 1 x {accumulation}"
                if nodes == 1
                else f"global_batch_size={global_batch} does not divide into "
                f"{world_size} ranks x accumulate_grad_batches={accumulation}"
            )
        micro = global_batch // per_step
    return BatchSizes(
        micro, accumulation, world_size, None if micro is None else micro * accumulation * world_size
    )


def _needs_batch_size(data: DictConfig, setting: str, why: str) -> None:
    """A ConfigError for ``setting``, which needs ``data.batch_size``, when the data config has none."""
    if "batch_size" not in data:
        raise ConfigError(
            f"{setting} needs data.batch_size: it {why}, and your data config ({data.get('_target_')}) "
            "has no batch_size; give your datamodule a batch_size argument and set it in the data "
            "config (docs/contract.md)"
        )


def usable_cores() -> list[int]:
    """The CPU cores this process may use (its affinity where the OS has one, as on Linux)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_cores() -> int:
    return len(usable_cores())


def _positive(key: str, value: Any, allowed: str = "a positive integer") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value} is not allowed: use {allowed}")


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value} is not allowed: use one of {', '.join(allowed)}")


def check(cfg: DictConfig) -> None:
    """Rules of a train config that types cannot express. Raises ConfigError."""
    _check_no_added_keys(cfg)
    _check_no_missing_values(cfg)
    trainer, data = cfg.trainer, cfg.data
    # Keys the trainer YAML leaves out have Lightning's defaults (lightning.Trainer's signature).
    if trainer.get("max_epochs") not in (None, -1):
        _positive("trainer.max_epochs", trainer.max_epochs, "a positive integer, or -1 with max_steps")
    if trainer.get("max_steps", -1) != -1:
        _positive("trainer.max_steps", trainer.max_steps, "a positive integer, or -1 (no limit)")
    _positive("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches", 1))
    _positive("trainer.num_nodes", trainer.get("num_nodes", 1))
    if "batch_size" in data:  # a datamodule may fix its batches itself (docs/contract.md)
        _positive("data.batch_size", data.batch_size)
    if cfg.tune.batch_size:
        _needs_batch_size(data, "tune.batch_size=true", "changes it to the largest that fits")
    if cfg.oom.action == "auto_shrink":
        _needs_batch_size(data, "oom=auto_shrink", "halves it after an out-of-memory error")
    if "global_batch_size" in data:  # where it was before it became the engine's own key
        raise ConfigError(
            f"data.global_batch_size={data.get('global_batch_size')} is not a key of your data config: "
            "remove it there and set the top-level global_batch_size (on the command line or in "
            "configs/train.yaml) to fix the effective batch"
        )
    if cfg.global_batch_size is not None:
        _positive("global_batch_size", cfg.global_batch_size)
    devices = trainer.get("devices", "auto")
    if not (devices == "auto" or device_count(devices)):
        raise ConfigError(
            f"trainer.devices={devices} is not allowed: use a positive integer, a list of "
            "device indices, or auto"
        )
    if cfg.precision.value not in PRECISION_VALUES:
        raise ConfigError(
            f"precision.value={cfg.precision.value} is not allowed: use one of " + ", ".join(PRECISION_VALUES)
        )
    _one_of("optimized_metric_mode", cfg.optimized_metric_mode, METRIC_MODES)
    if cfg.optimized_metric is None:
        _check_nothing_follows_a_metric(cfg)
    batch_sizes(data, trainer, global_batch=cfg.global_batch_size)  # raises when it does not divide
    check_runtime_options(cfg)


def _check_nothing_follows_a_metric(cfg: DictConfig) -> None:
    """optimized_metric=null (a module that logs no metric): a search and a callback that follow one
    cannot run; checkpoints keep the last epoch's instead of the best."""
    what = None
    if str(OmegaConf.select(cfg, "hydra.sweeper._target_", default="")).endswith("OptunaSearch"):
        what = "hparams_search=optuna maximises or minimises it"
    for name, node in cfg.callbacks.items():
        target = str(node.get("_target_", "")) if OmegaConf.is_dict(node) else ""
        if node is not None and "monitor" in node and node.monitor is None and "heckpoint" not in target:
            what = f"callbacks.{name} ({target.rsplit('.', 1)[-1]}) follows it"
    if what is not None:
        raise ConfigError(
            f"optimized_metric=null: {what}; set optimized_metric to a metric your module logs "
            "with self.log (e.g. val/loss)"
        )


def check_runtime_options(cfg: DictConfig) -> None:
    """Values that would fail only after torch loads (accelerator, devices), and on_nonfinite, oom,
    tune and gradient clipping. Raises ConfigError."""
    trainer = cfg.trainer
    accelerator, devices = trainer.get("accelerator", "auto"), trainer.get("devices", "auto")
    _one_of("trainer.accelerator", accelerator, ACCELERATORS)
    _one_of("on_nonfinite", cfg.on_nonfinite, NONFINITE_ACTIONS)
    for key in ("hang_timeout", "preempt_grace"):
        if cfg[key] < 0:
            raise ConfigError(f"{key}={cfg[key]} is not allowed: use a number of seconds, or 0 for off")
    _one_of("oom.action", cfg.oom.action, OOM_ACTIONS)
    _positive("oom.max_shrinks", cfg.oom.max_shrinks)
    _positive("oom.within_steps", cfg.oom.within_steps)
    if trainer.get("gradient_clip_algorithm") is not None:  # None: Lightning's default, norm
        _one_of("trainer.gradient_clip_algorithm", trainer.gradient_clip_algorithm, ("norm", "value"))
    if trainer.get("gradient_clip_val") is not None and trainer.gradient_clip_val < 0:
        raise ConfigError(
            f"trainer.gradient_clip_val={trainer.gradient_clip_val} is not allowed: use a positive "
            "number, or null for no clipping"
        )
    cores = cpu_cores()
    if accelerator == "cpu" and (device_count(devices) or 1) > cores:
        raise ConfigError(
            f"trainer.devices={devices} is more than the {cores} CPU cores this process may "
            f"use: on CPU every device is one process, so use trainer.devices=1 to {cores}"
        )
    tune = cfg.tune
    _one_of("tune.mode", tune.mode, TUNE_MODES)
    for key in ("init_val", "max_trials", "steps_per_trial", "max_val"):
        _positive(f"tune.{key}", tune[key])
    global_batch = cfg.global_batch_size
    if tune.batch_size and global_batch is not None:
        raise ConfigError(
            f"tune.batch_size=true cannot tune global_batch_size={global_batch}: "
            "set one of them, not both (the finder picks data.batch_size, the micro-batch)"
        )
    nodes = trainer.get("num_nodes", 1)
    if tune.batch_size and (device_count(devices) != 1 or nodes != 1):
        raise ConfigError(
            f"tune.batch_size=true runs on one device, not trainer.devices={devices} "
            f"trainer.num_nodes={nodes} (Lightning's finder does not support distributed "
            "strategies): tune with trainer.devices=1, then train with the found data.batch_size"
        )


def check_eval(cfg: DictConfig, program: str = "litlab-eval") -> None:
    """Rules of an eval (or predict) config. Raises ConfigError."""
    import zipfile

    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError(f"ckpt_path is required: {program} ckpt_path=<run dir>/checkpoints/last.ckpt")
    path = str(cfg.ckpt_path)
    if "://" not in path and not os.path.isfile(path):
        raise ConfigError(f"ckpt_path={path} is not a file")
    if "://" not in path and not zipfile.is_zipfile(path):  # torch.save writes zip archives
        raise ConfigError(
            f"ckpt_path={path} is not a checkpoint: pass a .ckpt file that litlab-train wrote, "
            "e.g. <run dir>/checkpoints/last.ckpt"
        )


def _check_no_missing_values(cfg: DictConfig) -> None:
    """A ``???`` left in a config (``data.root`` of data=image_folder) must be set by the user: say
    which key, before anything tries to read it. (The storage check names storage.root itself.)"""

    def walk(node: Any, path: str) -> None:
        keys = range(len(node)) if OmegaConf.is_list(node) else list(node.keys())
        for key in keys:
            child = node._get_node(key)
            name = f"{path}{key}"
            if child is None or child._is_interpolation() or name.startswith(("hydra", "storage")):
                continue
            if child._is_missing():
                raise ConfigError(f"{name} is required: set it, e.g. {name}=...")
            if OmegaConf.is_config(child):
                walk(child, f"{name}.")

    walk(cfg, "")


def _check_no_added_keys(cfg: DictConfig, prefix: str = "") -> None:
    """``+oom.foo=1`` adds a key even to a typed node; only typos do that, so refuse them.
    (Your groups have no schema: their keys are checked against their ``_target_``'s signature.)"""
    schema_type = OmegaConf.get_type(cfg)
    allowed = (
        {f.name for f in dataclasses.fields(schema_type)} if dataclasses.is_dataclass(schema_type) else None
    )
    for key in cfg:
        name = f"{prefix}{key}"
        if name == "hydra":
            continue
        if allowed is not None and key not in allowed:
            public = ", ".join(sorted(k for k in allowed if not k.startswith("_")))
            raise ConfigError(f"unknown key '{name}': allowed keys are {public}")
        node = cfg._get_node(key)
        if (
            OmegaConf.is_dict(node)
            and not OmegaConf.is_missing(cfg, key)
            and dataclasses.is_dataclass(OmegaConf.get_type(node))
        ):
            _check_no_added_keys(node, f"{name}.")
