"""The config schema: typed dataclasses that Hydra merges every config file into.

Registered in Hydra's ConfigStore, so an unknown key (``trainer.max_epoch=3``) or a wrong type
(``trainer.max_epochs=abc``) fails while the config is composed, with Hydra's own message.
Rules that types cannot express (positive numbers, a global batch that divides) are in
``check()``. Nothing here imports torch or Lightning: a bad config fails in well under a second.

Group options with their own fields get their own schema, stored under ``schema/<group>/<option>``
and named first in the option's defaults list (``- /schema/data/digits@_here_``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

# --- trainer ---------------------------------------------------------------------------------


@dataclass
class TrainerConfig:
    """Plain ``lightning.Trainer`` arguments (strategy, precision, callbacks, loggers are groups)."""

    accelerator: str = "cpu"
    devices: Any = 1  # an int, a list of device indices, or "auto"
    num_nodes: int = 1
    max_epochs: int = 10
    max_steps: int = -1
    min_epochs: int | None = None
    max_time: str | None = None
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    check_val_every_n_epoch: int | None = 1
    val_check_interval: Any = None  # int (batches) or float (fraction of an epoch)
    log_every_n_steps: int = 10
    limit_train_batches: Any = None  # int (batches) or float (fraction)
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    num_sanity_val_steps: int = 2
    deterministic: Any = False  # bool or "warn"
    benchmark: bool | None = None
    fast_dev_run: Any = False  # bool or a number of batches
    overfit_batches: float = 0.0
    detect_anomaly: bool = False
    enable_model_summary: bool = True
    inference_mode: bool = True
    profiler: str | None = None


# --- strategy and precision ------------------------------------------------------------------


@dataclass
class StrategyConfig:
    _target_: str | None = None
    name: str = "auto"


@dataclass
class TimeoutConfig:
    _target_: str = "datetime.timedelta"
    seconds: int = 1800


@dataclass
class DDPStrategyConfig(StrategyConfig):
    process_group_backend: str | None = None  # null: nccl on GPUs, gloo on CPU
    find_unused_parameters: bool = False
    static_graph: bool = False
    timeout: TimeoutConfig = field(default_factory=TimeoutConfig)
    start_method: str = "popen"  # popen: subprocess launcher; spawn: torch.multiprocessing


@dataclass
class WrapPolicyConfig:
    _target_: str = "torch.distributed.fsdp.wrap.size_based_auto_wrap_policy"
    _partial_: bool = True
    min_num_params: int = 100_000


@dataclass
class FSDPStrategyConfig(StrategyConfig):
    sharding_strategy: str = "FULL_SHARD"
    auto_wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    cpu_offload: bool = False
    state_dict_type: str = "full"
    process_group_backend: str | None = None
    timeout: TimeoutConfig = field(default_factory=TimeoutConfig)


PRECISION_VALUES = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    value: str = "32-true"  # a Lightning precision string, one of PRECISION_VALUES


# --- storage ---------------------------------------------------------------------------------


@dataclass
class StorageConfig:
    name: str = "local"
    root: str = MISSING  # a path or fsspec URL
    create_root: bool = True  # false for mounted drives: a missing mount point is an error
    copy_logs: bool = False  # copy TensorBoard event files here with every checkpoint


@dataclass
class S3StorageConfig(StorageConfig):
    # No key or secret fields: credentials come only from the environment / AWS credential chain.
    endpoint_url: str | None = None
    region: str | None = None
    check_timeout_s: float = 2.0


@dataclass
class GCSStorageConfig(StorageConfig):
    endpoint_url: str | None = None
    project: str | None = None
    check_timeout_s: float = 2.0


# --- data ------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    _target_: str = MISSING
    name: str = MISSING
    image_shape: list[int] = MISSING  # channels, height, width
    num_classes: int = MISSING
    batch_size: int = 64  # the micro-batch: samples per device per optimizer step
    global_batch_size: int | None = None  # fixes the effective batch; batch_size is then derived
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    split_seed: int = 0
    augment: list[Any] = field(default_factory=list)  # torchvision.transforms.v2 entries


@dataclass
class DigitsDataConfig(DataConfig):
    pass


@dataclass
class SyntheticDataConfig(DataConfig):
    num_samples: int = 2048


# --- model -----------------------------------------------------------------------------------


@dataclass
class NetConfig:
    _target_: str = MISSING
    image_shape: list[int] = MISSING
    num_classes: int = MISSING


@dataclass
class MLPNetConfig(NetConfig):
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])
    dropout: float = 0.1


@dataclass
class CNNNetConfig(NetConfig):
    channels: list[int] = field(default_factory=lambda: [32, 64])
    dropout: float = 0.1


@dataclass
class ResNetNetConfig(NetConfig):
    small_inputs: bool = True


@dataclass
class ModelConfig:
    name: str = MISSING
    net: Any = MISSING
    compile: bool = False
    channels_last: bool = False


@dataclass
class MLPModelConfig(ModelConfig):
    net: MLPNetConfig = field(default_factory=MLPNetConfig)


@dataclass
class CNNModelConfig(ModelConfig):
    net: CNNNetConfig = field(default_factory=CNNNetConfig)


@dataclass
class ResNetModelConfig(ModelConfig):
    net: ResNetNetConfig = field(default_factory=ResNetNetConfig)


# --- optimizer and scheduler -----------------------------------------------------------------


@dataclass
class AdamWConfig:
    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4


@dataclass
class CosineScheduleConfig:
    _target_: str = "litlab.models.schedules.cosine"
    _partial_: bool = True
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0


@dataclass
class ExponentialScheduleConfig:
    _target_: str = "litlab.models.schedules.exponential"
    _partial_: bool = True
    warmup_steps: int = 0
    gamma: float = 0.9


@dataclass
class OneCycleScheduleConfig:
    _target_: str = "litlab.models.schedules.onecycle"
    _partial_: bool = True
    max_lr_factor: float = 10.0
    pct_start: float = 0.3


@dataclass
class SchedulerConfig:
    name: str = "none"


@dataclass
class SteppedSchedulerConfig(SchedulerConfig):
    scheduler: Any = MISSING
    interval: str = "step"  # "step" or "epoch"
    frequency: int = 1


@dataclass
class CosineSchedulerConfig(SteppedSchedulerConfig):
    scheduler: CosineScheduleConfig = field(default_factory=CosineScheduleConfig)


@dataclass
class ExponentialSchedulerConfig(SteppedSchedulerConfig):
    scheduler: ExponentialScheduleConfig = field(default_factory=ExponentialScheduleConfig)


@dataclass
class OneCycleSchedulerConfig(SteppedSchedulerConfig):
    scheduler: OneCycleScheduleConfig = field(default_factory=OneCycleScheduleConfig)


# --- paths and the entry configs -------------------------------------------------------------


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class TrainConfig:
    """configs/train.yaml."""

    trainer: TrainerConfig = MISSING
    strategy: Any = MISSING
    precision: PrecisionConfig = MISSING
    callbacks: dict[str, Any] = field(default_factory=dict)
    storage: StorageConfig = MISSING
    data: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = MISSING
    logger: dict[str, Any] = field(default_factory=dict)
    paths: PathsConfig = MISSING
    task_name: str = "train"
    experiment_name: str = "default"
    run_name: str | None = None
    resume: str = "auto"  # auto, never, or the path/URL of a checkpoint
    seed: int = 42
    test_after_fit: bool = True
    optimized_metric: str = "val/acc"


@dataclass
class EvalConfig:
    """configs/eval.yaml."""

    paths: PathsConfig = MISSING
    task_name: str = "eval"
    ckpt_path: str = MISSING
    accelerator: str = "cpu"
    devices: Any = 1


def register() -> None:
    """Store the schemas in Hydra's ConfigStore and register litlab's resolvers (idempotent)."""
    from litlab import launch

    register_resolvers()
    launch.register()  # one run directory for all ranks; Slurm job sizes
    store = ConfigStore.instance()
    store.store(name="litlab_train_schema", node=TrainConfig)
    store.store(name="litlab_eval_schema", node=EvalConfig)
    options = {
        "trainer": {"default": TrainerConfig},
        "strategy": {
            "auto": StrategyConfig,
            "ddp": DDPStrategyConfig,
            "fsdp": FSDPStrategyConfig,
        },
        "precision": {"default": PrecisionConfig},
        "storage": {"default": StorageConfig, "s3": S3StorageConfig, "gcs": GCSStorageConfig},
        "data": {"digits": DigitsDataConfig, "synthetic": SyntheticDataConfig},
        "model": {"mlp": MLPModelConfig, "cnn": CNNModelConfig, "resnet": ResNetModelConfig},
        "optimizer": {"adamw": AdamWConfig, "sgd": SGDConfig},
        "scheduler": {
            "none": SchedulerConfig,
            "cosine": CosineSchedulerConfig,
            "exponential": ExponentialSchedulerConfig,
            "onecycle": OneCycleSchedulerConfig,
        },
    }
    for group, schemas in options.items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node, package=group)


# --- rules beyond types ----------------------------------------------------------------------


class ConfigError(ValueError):
    """A config value that is well-typed but not allowed; the message is one sentence."""


@dataclass(frozen=True)
class BatchSizes:
    micro: int  # per device per optimizer step (data.batch_size)
    accumulation: int
    world_size: int  # devices x nodes
    effective: int  # samples per optimizer step across all ranks


def device_count(devices: Any) -> int | None:
    """Processes per node asked for by ``trainer.devices``; None for "auto" (known only later)."""
    if isinstance(devices, bool):
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


def batch_sizes(data: DictConfig, trainer: DictConfig, world_size: int | None = None) -> BatchSizes:
    """The micro-batch and effective batch of a run; derives the micro-batch from a global batch."""
    if world_size is None:
        world_size = (device_count(trainer.devices) or 1) * trainer.num_nodes
    accumulation = trainer.accumulate_grad_batches
    micro = data.batch_size
    if data.global_batch_size is not None:
        per_step = world_size * accumulation
        if data.global_batch_size % per_step != 0:
            raise ConfigError(
                f"data.global_batch_size={data.global_batch_size} does not divide into "
                f"devices x num_nodes x accumulate_grad_batches = {world_size} x 1 x {accumulation}"
                if trainer.num_nodes == 1
                else f"data.global_batch_size={data.global_batch_size} does not divide into "
                f"{world_size} ranks x accumulate_grad_batches={accumulation}"
            )
        micro = data.global_batch_size // per_step
    return BatchSizes(micro, accumulation, world_size, micro * accumulation * world_size)


def _positive(key: str, value: Any, allowed: str = "a positive integer") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value} is not allowed: use {allowed}")


def check(cfg: DictConfig) -> None:
    """Rules of a train config that types cannot express. Raises ConfigError."""
    trainer, data = cfg.trainer, cfg.data
    if trainer.max_epochs != -1:
        _positive("trainer.max_epochs", trainer.max_epochs, "a positive integer, or -1 with max_steps")
    if trainer.max_steps != -1:
        _positive("trainer.max_steps", trainer.max_steps, "a positive integer, or -1 (no limit)")
    _positive("trainer.accumulate_grad_batches", trainer.accumulate_grad_batches)
    _positive("trainer.num_nodes", trainer.num_nodes)
    _positive("data.batch_size", data.batch_size)
    if data.global_batch_size is not None:
        _positive("data.global_batch_size", data.global_batch_size)
    devices = trainer.devices
    if not (devices == "auto" or device_count(devices)):
        raise ConfigError(
            f"trainer.devices={devices} is not allowed: use a positive integer, a list of "
            "device indices, or auto"
        )
    if cfg.precision.value not in PRECISION_VALUES:
        raise ConfigError(
            f"precision.value={cfg.precision.value} is not allowed: use one of " + ", ".join(PRECISION_VALUES)
        )
    if not 0 <= data.val_fraction < 1 or not 0 <= data.test_fraction < 1:
        raise ConfigError(
            f"data.val_fraction={data.val_fraction} and data.test_fraction={data.test_fraction} "
            "must each be at least 0 and below 1"
        )
    batch_sizes(data, trainer)  # raises when a fixed global batch does not divide


def check_eval(cfg: DictConfig) -> None:
    """Rules of an eval config. Raises ConfigError."""
    import os

    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError("ckpt_path is required: litlab-eval ckpt_path=<run dir>/checkpoints/last.ckpt")
    path = str(cfg.ckpt_path)
    if "://" not in path and not os.path.isfile(path):
        raise ConfigError(f"ckpt_path={path} is not a file")


def register_resolvers() -> None:
    """``${litlab_uid:}``: a short random id, fixed for the process (cached), for run directories.
    ``${litlab_cwd:}``: the directory litlab was started from (paths.root_dir)."""
    import secrets

    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("litlab_uid"):
        OmegaConf.register_new_resolver("litlab_uid", lambda: secrets.token_hex(3), use_cache=True)
    if not OmegaConf.has_resolver("litlab_cwd"):
        OmegaConf.register_new_resolver("litlab_cwd", _start_dir)


def _start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    import os

    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()
