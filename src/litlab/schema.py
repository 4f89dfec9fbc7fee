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


@dataclass
class ImageFolderDataConfig(DataConfig):
    root: str = MISSING  # root/<class>/<image>, or root/train/<class>/... with val/ (and test/)
    num_workers: int | None = None  # null: CPU cores per device, at most 8
    pin_memory: bool | None = None  # null: on when training on a GPU
    mean: list[float] = field(default_factory=lambda: [0.5])  # per channel, or one for all
    std: list[float] = field(default_factory=lambda: [0.5])


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


# --- faults: non-finite loss, out of memory, batch-size tuning -------------------------------

NONFINITE_ACTIONS = ("fail", "skip")
OOM_ACTIONS = ("fail", "auto_shrink")
TUNE_MODES = ("power", "binsearch")
SWEEP_ISOLATION = ("auto", "process")


@dataclass
class OomConfig:
    action: str = "fail"  # one of OOM_ACTIONS
    max_shrinks: int = 4  # auto_shrink: halvings of the micro-batch at most
    within_steps: int = 10  # auto_shrink: only an OOM before this many optimizer steps is retried


@dataclass
class TuneConfig:
    """Lightning's batch-size finder (``lightning.pytorch.tuner.Tuner.scale_batch_size``)."""

    batch_size: bool = False
    mode: str = "power"  # one of TUNE_MODES
    init_val: int = 2
    max_trials: int = 25
    steps_per_trial: int = 3
    max_val: int = 8192


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
    on_nonfinite: str = "fail"  # one of NONFINITE_ACTIONS
    sweep_isolation: str = "auto"  # one of SWEEP_ISOLATION
    oom: OomConfig = field(default_factory=OomConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


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
        "oom": {"default": OomConfig},
        "storage": {"default": StorageConfig, "s3": S3StorageConfig, "gcs": GCSStorageConfig},
        "data": {
            "digits": DigitsDataConfig,
            "synthetic": SyntheticDataConfig,
            "image_folder": ImageFolderDataConfig,
        },
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
    _check_no_added_keys(cfg)
    trainer, data = cfg.trainer, cfg.data
    if "root" in data.keys():  # noqa: SIM118 (data=image_folder; `in data` is False while root is ???)
        image_folder_classes(data)  # before anything reads data.num_classes, which counts them
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
    check_runtime_options(cfg)


def check_eval(cfg: DictConfig) -> None:
    """Rules of an eval config. Raises ConfigError."""
    import os
    import zipfile

    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError("ckpt_path is required: litlab-eval ckpt_path=<run dir>/checkpoints/last.ckpt")
    path = str(cfg.ckpt_path)
    if "://" not in path and not os.path.isfile(path):
        raise ConfigError(f"ckpt_path={path} is not a file")
    if "://" not in path and not zipfile.is_zipfile(path):  # torch.save writes zip archives
        raise ConfigError(
            f"ckpt_path={path} is not a checkpoint: pass a .ckpt file that litlab-train wrote, "
            "e.g. <run dir>/checkpoints/last.ckpt"
        )


def register_resolvers() -> None:
    """``${litlab_uid:}``: a short random id, fixed for the process (cached), for run directories.
    ``${litlab_cwd:}``: the directory litlab was started from (paths.root_dir).
    ``${litlab_class_folders:ROOT}``: the number of class folders of an image folder."""
    import secrets

    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("litlab_uid"):
        OmegaConf.register_new_resolver("litlab_uid", lambda: secrets.token_hex(3), use_cache=True)
    if not OmegaConf.has_resolver("litlab_cwd"):
        OmegaConf.register_new_resolver("litlab_cwd", _start_dir)
    if not OmegaConf.has_resolver("litlab_class_folders"):
        OmegaConf.register_new_resolver(
            "litlab_class_folders", lambda root: len(image_folder_classes({"root": root})), use_cache=True
        )


def _start_dir() -> str:
    # ${hydra:runtime.cwd} fails where Hydra has not set its config yet: in a multirun's own process,
    # whose sweeper and launcher resolve hydra.sweep.dir (under paths.log_dir) before any job starts.
    import os

    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.cwd if HydraConfig.initialized() else os.getcwd()


ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")  # Lightning's accelerator names


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity where the OS has one, as on Linux)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_runtime_options(cfg: DictConfig) -> None:
    """Values that would fail only after torch loads (accelerator, learning rate, devices), and
    on_nonfinite, oom, tune and gradient clipping. Raises ConfigError."""
    trainer = cfg.trainer
    _one_of("trainer.accelerator", trainer.accelerator, ACCELERATORS)
    lr = cfg.optimizer.get("lr")
    if isinstance(lr, (int, float)) and lr <= 0:
        raise ConfigError(f"optimizer.lr={lr} is not allowed: use a positive learning rate")
    _one_of("on_nonfinite", cfg.on_nonfinite, NONFINITE_ACTIONS)
    _one_of("sweep_isolation", cfg.sweep_isolation, SWEEP_ISOLATION)
    _one_of("oom.action", cfg.oom.action, OOM_ACTIONS)
    _positive("oom.max_shrinks", cfg.oom.max_shrinks)
    _positive("oom.within_steps", cfg.oom.within_steps)
    _one_of("trainer.gradient_clip_algorithm", trainer.gradient_clip_algorithm, ("norm", "value"))
    if trainer.gradient_clip_val is not None and trainer.gradient_clip_val < 0:
        raise ConfigError(
            f"trainer.gradient_clip_val={trainer.gradient_clip_val} is not allowed: use a positive "
            "number, or null for no clipping"
        )
    cores = cpu_cores()
    if trainer.accelerator == "cpu" and (device_count(trainer.devices) or 1) > cores:
        raise ConfigError(
            f"trainer.devices={trainer.devices} is more than the {cores} CPU cores this process may "
            f"use: on CPU every device is one process, so use trainer.devices=1 to {cores}"
        )
    tune = cfg.tune
    _one_of("tune.mode", tune.mode, TUNE_MODES)
    for key in ("init_val", "max_trials", "steps_per_trial", "max_val"):
        _positive(f"tune.{key}", tune[key])
    if tune.batch_size and cfg.data.global_batch_size is not None:
        raise ConfigError(
            f"tune.batch_size=true cannot tune data.global_batch_size={cfg.data.global_batch_size}: "
            "set one of them, not both (the finder picks data.batch_size, the micro-batch)"
        )
    if tune.batch_size and (device_count(trainer.devices) != 1 or trainer.num_nodes != 1):
        raise ConfigError(
            f"tune.batch_size=true runs on one device, not trainer.devices={trainer.devices} "
            f"trainer.num_nodes={trainer.num_nodes} (Lightning's finder does not support distributed "
            "strategies): tune with trainer.devices=1, then train with the found data.batch_size"
        )


def _check_no_added_keys(cfg: DictConfig, prefix: str = "") -> None:
    """``+trainer.foo=1`` adds a key even to a typed node; only typos do that, so refuse them."""
    import dataclasses

    from omegaconf import OmegaConf

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
        if OmegaConf.is_dict(node) and not OmegaConf.is_missing(cfg, key):
            _check_no_added_keys(node, f"{name}.")


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value} is not allowed: use one of {', '.join(allowed)}")


# torchvision.datasets.folder.IMG_EXTENSIONS, repeated here so the check runs without torch.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def image_folder_classes(data: Any) -> list[str]:
    """Class names (sub-folders holding images) of ``data.root``, or of ``data.root/train`` when it
    has train/ and val/ splits. Raises ConfigError for a missing, unreadable or empty folder."""
    from pathlib import Path

    from omegaconf import OmegaConf

    if OmegaConf.is_config(data) and OmegaConf.is_missing(data, "root"):
        raise ConfigError(
            "data.root is required with data=image_folder: the folder that holds one sub-folder of "
            "images per class (data.root=/path/to/images)"
        )
    root = Path(str(data["root"])).expanduser()
    layout = "one sub-folder of images per class (root/<class>/<image>.png)"
    if not root.is_dir():
        raise ConfigError(f"data.root={root} is not a folder: point it at a folder with {layout}")
    folder = root / "train" if (root / "train").is_dir() and (root / "val").is_dir() else root
    try:
        classes = sorted(
            d.name
            for d in folder.iterdir()
            if d.is_dir() and any(f.suffix.lower() in IMAGE_EXTENSIONS for f in d.rglob("*"))
        )
    except OSError as error:
        raise ConfigError(f"data.root={root} cannot be read ({error.strerror})") from error
    if not classes:
        raise ConfigError(
            f"data.root={root} holds no images: expected {layout}, with files ending in "
            + ", ".join(IMAGE_EXTENSIONS)
        )
    shape = data.get("image_shape") if hasattr(data, "get") else None
    if shape is not None and not OmegaConf.is_missing(data, "image_shape") and shape[0] not in (1, 3):
        raise ConfigError(
            f"data.image_shape={list(shape)} is not allowed with data=image_folder: the first entry "
            "is the channels, 1 (grey) or 3 (RGB)"
        )
    return classes
