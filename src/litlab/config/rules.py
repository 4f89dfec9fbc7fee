"""Rules of a config that types cannot express, and the batch sizes they imply.

``check`` (train) and ``check_eval`` raise ``ConfigError``: one sentence naming the key, the bad
value and what is allowed. Nothing here imports torch: the preflight runs these before it loads.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

PRECISION_VALUES = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")  # Lightning's accelerator names
# Settings that name one of a few values. OmegaConf 2.3 has no Literal type, and an Enum would turn
# each value into an Enum object wherever the config goes (checkpoints, summaries, Optuna). A trainer
# key the YAML leaves out has Lightning's default, the first value.
_CHOICES = {
    "precision.value": PRECISION_VALUES,
    "optimized_metric_mode": ("min", "max"),
    "trainer.accelerator": ACCELERATORS,
    "on_nonfinite": ("fail", "skip"),
    "oom.action": ("fail", "auto_shrink"),
    "trainer.gradient_clip_algorithm": ("norm", "value", None),  # null: Lightning's default, norm
    "tune.mode": ("power", "binsearch"),
}
# Settings that are positive integers; one left out (trainer's, a datamodule's batch_size) passes.
_POSITIVE = ("trainer.num_nodes", "data.batch_size", "oom.max_shrinks", "oom.within_steps")
_POSITIVE += ("tune.init_val", "tune.max_trials", "tune.steps_per_trial", "tune.max_val")


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


def allowed_keys(schema_type: Any) -> str | None:
    """The names of a schema dataclass's fields, as an error says them; None for anything else."""
    if not dataclasses.is_dataclass(schema_type):
        return None
    names = sorted(f.name for f in dataclasses.fields(schema_type) if not f.name.startswith("_"))
    return f"allowed keys are {', '.join(names)}"


def check(cfg: DictConfig) -> None:
    """Rules of a train config that types cannot express (values that would otherwise fail only after
    torch loads). Raises ConfigError."""
    _check_no_added_keys(cfg)
    _check_no_missing_values(cfg)
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(cfg, key, default=allowed[0])
        if value not in allowed:
            shown = ", ".join(a for a in allowed if a is not None)
            raise ConfigError(f"{key}={value} is not allowed: use one of {shown}")
    for key in _POSITIVE:
        _positive(key, OmegaConf.select(cfg, key, default=1))
    trainer, data, global_batch = cfg.trainer, cfg.data, cfg.global_batch_size
    # Keys the trainer YAML leaves out have Lightning's defaults (lightning.Trainer's signature).
    devices = trainer.get("devices", "auto")
    if trainer.get("max_epochs") not in (None, -1):
        _positive("trainer.max_epochs", trainer.max_epochs, "a positive integer, or -1 with max_steps")
    if trainer.get("max_steps", -1) != -1:
        _positive("trainer.max_steps", trainer.max_steps, "a positive integer, or -1 (no limit)")
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
    if global_batch is not None:
        _positive("global_batch_size", global_batch)
    if not (devices == "auto" or device_count(devices)):
        raise ConfigError(
            f"trainer.devices={devices} is not allowed: use a positive integer, a list of "
            "device indices, or auto"
        )
    if cfg.optimized_metric is None:
        _check_nothing_follows_a_metric(cfg)
    batch_sizes(data, trainer, global_batch=global_batch)  # raises when it does not divide
    _check_runtime_options(cfg)


def _check_runtime_options(cfg: DictConfig) -> None:
    """The watch's limits, gradient clipping, CPU devices and the batch-size finder."""
    trainer, tune, global_batch = cfg.trainer, cfg.tune, cfg.global_batch_size
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    for key in ("hang_timeout", "preempt_grace"):
        if cfg[key] < 0:
            raise ConfigError(f"{key}={cfg[key]} is not allowed: use a number of seconds, or 0 for off")
    if trainer.get("gradient_clip_val") is not None and trainer.gradient_clip_val < 0:
        raise ConfigError(
            f"trainer.gradient_clip_val={trainer.gradient_clip_val} is not allowed: use a positive "
            "number, or null for no clipping"
        )
    cores = cpu_cores()
    if trainer.get("accelerator", "auto") == "cpu" and (device_count(devices) or 1) > cores:
        raise ConfigError(
            f"trainer.devices={devices} is more than the {cores} CPU cores this process may "
            f"use: on CPU every device is one process, so use trainer.devices=1 to {cores}"
        )
    if tune.batch_size and global_batch is not None:
        raise ConfigError(
            f"tune.batch_size=true cannot tune global_batch_size={global_batch}: "
            "set one of them, not both (the finder picks data.batch_size, the micro-batch)"
        )
    if tune.batch_size and (device_count(devices) != 1 or nodes != 1):
        raise ConfigError(
            f"tune.batch_size=true runs on one device, not trainer.devices={devices} "
            f"trainer.num_nodes={nodes} (Lightning's finder does not support distributed "
            "strategies): tune with trainer.devices=1, then train with the found data.batch_size"
        )


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


def check_eval(cfg: DictConfig, program: str = "litlab-eval") -> None:
    """Rules of an eval (or predict) config. Raises ConfigError."""
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


def _check_no_missing_values(node: Any, path: str = "") -> None:
    """A ``???`` left in a config (``data.root`` of data=image_folder): say which key, before anything
    reads it (the storage check names storage.root itself)."""
    for key in range(len(node)) if OmegaConf.is_list(node) else list(node.keys()):
        child, name = node._get_node(key), f"{path}{key}"
        if child is None or child._is_interpolation() or name.startswith(("hydra", "storage")):
            continue
        if child._is_missing():
            raise ConfigError(f"{name} is required: set it, e.g. {name}=...")
        if OmegaConf.is_config(child):
            _check_no_missing_values(child, f"{name}.")


def _check_no_added_keys(cfg: DictConfig, prefix: str = "") -> None:
    """``+oom.foo=1`` adds a key even to a typed node; only typos do that, so refuse them.
    (Your groups have no schema: their keys are checked against their ``_target_``'s signature.)"""
    schema_type = OmegaConf.get_type(cfg)
    fields = (
        {f.name for f in dataclasses.fields(schema_type)} if dataclasses.is_dataclass(schema_type) else None
    )
    for key in cfg:
        name = f"{prefix}{key}"
        if name == "hydra":
            continue
        if fields is not None and key not in fields:
            raise ConfigError(f"unknown key '{name}': {allowed_keys(schema_type)}")
        node = cfg._get_node(key)
        typed = OmegaConf.is_dict(node) and dataclasses.is_dataclass(OmegaConf.get_type(node))
        if typed and not OmegaConf.is_missing(cfg, key):
            _check_no_added_keys(node, f"{name}.")
