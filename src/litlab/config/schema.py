"""Types of the engine's config groups: what Hydra merges configs/train.yaml and its engine groups into.

Registered in Hydra's ConfigStore, so an unknown key (``trainer.max_epoch=3``) or a wrong type
(``trainer.max_epochs=abc``) of an engine group fails while the config is composed. The values
live in the YAML files only: every field here is MISSING (one place for each default). Your groups
(model, data, optimizer, scheduler, ...) have no schema: ``litlab.config.signatures`` checks their
keys against their ``_target_``'s signature. Rules that types cannot express are in
``litlab.config.rules``. Nothing here imports torch or Lightning.

Options with fields of their own get their own schema, stored under ``schema/<group>/<option>``
and named first in the option's defaults list (``- /schema/strategy/ddp@_here_``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class TrainerConfig:
    """Plain ``lightning.Trainer`` arguments (strategy, precision, callbacks, loggers are groups)."""

    accelerator: str = MISSING
    devices: Any = MISSING  # an int, a list of device indices, or "auto"
    num_nodes: int = MISSING
    max_epochs: int = MISSING
    max_steps: int = MISSING
    min_epochs: int | None = MISSING
    max_time: str | None = MISSING
    accumulate_grad_batches: int = MISSING
    gradient_clip_val: float | None = MISSING
    gradient_clip_algorithm: str = MISSING
    check_val_every_n_epoch: int | None = MISSING
    val_check_interval: Any = MISSING  # int (batches) or float (fraction of an epoch)
    log_every_n_steps: int = MISSING
    limit_train_batches: Any = MISSING  # int (batches) or float (fraction)
    limit_val_batches: Any = MISSING
    limit_test_batches: Any = MISSING
    num_sanity_val_steps: int = MISSING
    deterministic: Any = MISSING  # bool or "warn"
    benchmark: bool | None = MISSING
    fast_dev_run: Any = MISSING  # bool or a number of batches
    overfit_batches: float = MISSING
    detect_anomaly: bool = MISSING
    enable_model_summary: bool = MISSING
    inference_mode: bool = MISSING
    profiler: str | None = MISSING


@dataclass
class StrategyConfig:
    _target_: str | None = MISSING
    name: str = MISSING


@dataclass
class TimeoutConfig:
    _target_: str = MISSING
    seconds: int = MISSING


@dataclass
class DDPStrategyConfig(StrategyConfig):
    process_group_backend: str | None = MISSING  # null: nccl on GPUs, gloo on CPU
    find_unused_parameters: bool = MISSING
    static_graph: bool = MISSING
    timeout: TimeoutConfig = MISSING
    start_method: str = MISSING  # popen: subprocess launcher; spawn: torch.multiprocessing


@dataclass
class WrapPolicyConfig:
    _target_: str = MISSING
    _partial_: bool = MISSING
    min_num_params: int = MISSING


@dataclass
class FSDPStrategyConfig(StrategyConfig):
    sharding_strategy: str = MISSING
    auto_wrap_policy: WrapPolicyConfig = MISSING
    cpu_offload: bool = MISSING
    state_dict_type: str = MISSING
    process_group_backend: str | None = MISSING
    timeout: TimeoutConfig = MISSING


@dataclass
class PrecisionConfig:
    name: str = MISSING
    value: str = MISSING  # a Lightning precision string (rules.PRECISION_VALUES)


@dataclass
class StorageConfig:
    name: str = MISSING
    root: str = MISSING  # a path or fsspec URL
    create_root: bool = MISSING  # false for mounted drives: a missing mount point is an error
    copy_logs: bool = MISSING  # copy TensorBoard event files here with every checkpoint


@dataclass
class ObjectStorageConfig(StorageConfig):
    # No key or secret fields: credentials come only from the environment / the provider's chain.
    endpoint_url: str | None = MISSING
    check_timeout_s: float = MISSING


@dataclass
class S3StorageConfig(ObjectStorageConfig):
    region: str | None = MISSING
    max_attempts: int = MISSING  # tries of every request during the run (botocore's standard retries)
    timeout_s: float = MISSING  # per try: to connect, between bytes, unacknowledged sends


@dataclass
class GCSStorageConfig(ObjectStorageConfig):
    project: str | None = MISSING


@dataclass
class OomConfig:
    action: str = MISSING  # rules.OOM_ACTIONS
    max_shrinks: int = MISSING  # auto_shrink: halvings of the micro-batch at most
    within_steps: int = MISSING  # auto_shrink: only an OOM before this many optimizer steps is retried


@dataclass
class TuneConfig:
    """Lightning's batch-size finder (``lightning.pytorch.tuner.Tuner.scale_batch_size``)."""

    batch_size: bool = MISSING
    mode: str = MISSING  # rules.TUNE_MODES
    init_val: int = MISSING
    max_trials: int = MISSING
    steps_per_trial: int = MISSING
    max_val: int = MISSING


@dataclass
class PathsConfig:
    root_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class TrainConfig:
    """configs/train.yaml. ``model``, ``data``, ``optimizer``, ``scheduler`` are your groups: any
    keys their ``_target_`` accepts (checked by ``litlab.config.signatures``)."""

    trainer: TrainerConfig = MISSING
    strategy: Any = MISSING
    precision: PrecisionConfig = MISSING
    callbacks: dict[str, Any] = MISSING
    storage: StorageConfig = MISSING
    data: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = MISSING
    logger: dict[str, Any] = MISSING
    paths: PathsConfig = MISSING
    task_name: str = MISSING
    experiment_name: str = MISSING
    run_name: str | None = MISSING
    resume: str = MISSING  # auto, never, or the path/URL of a checkpoint
    seed: int = MISSING
    global_batch_size: int | None = MISSING  # fixes the effective batch; data.batch_size is derived
    compile: bool = MISSING  # torch.compile the LightningModule's forward
    test_after_fit: bool = MISSING
    optimized_metric: str = MISSING
    optimized_metric_mode: str = MISSING  # min or max
    on_nonfinite: str = MISSING  # rules.NONFINITE_ACTIONS
    hang_timeout: float = MISSING  # seconds without progress before the run ends; 0: off
    preempt_grace: float = MISSING  # seconds after SIGTERM to reach a batch boundary
    oom: OomConfig = MISSING
    tune: TuneConfig = MISSING


@dataclass
class EvalConfig:
    """configs/eval.yaml."""

    paths: PathsConfig = MISSING
    task_name: str = MISSING
    ckpt_path: str = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING


def register() -> None:
    """Store the schemas in Hydra's ConfigStore and register litlab's resolvers (idempotent)."""
    from litlab.config import resolvers

    resolvers.register()
    store = ConfigStore.instance()
    store.store(name="litlab_train_schema", node=TrainConfig)
    store.store(name="litlab_eval_schema", node=EvalConfig)
    options = {
        "trainer": {"default": TrainerConfig},
        "strategy": {"auto": StrategyConfig, "ddp": DDPStrategyConfig, "fsdp": FSDPStrategyConfig},
        "precision": {"default": PrecisionConfig},
        "oom": {"default": OomConfig},
        "storage": {"default": StorageConfig, "s3": S3StorageConfig, "gcs": GCSStorageConfig},
    }
    for group, schemas in options.items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node, package=group)
