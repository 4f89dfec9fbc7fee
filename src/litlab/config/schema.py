"""Types of litlab's own settings (no ``_target_``), in Hydra's ConfigStore: checked while composing.
``_target_`` nodes are checked by ``litlab.config.signatures``, what a type cannot say by
``litlab.config.rules``. Every field is MISSING: the values live in the YAML files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class _PrecisionConfig:
    name: str = MISSING
    value: str = MISSING  # a Lightning precision string (rules.PRECISION_VALUES)


@dataclass
class _StorageConfig:
    name: str = MISSING
    root: str = MISSING  # a path or fsspec URL
    create_root: bool = MISSING  # false for mounted drives: a missing mount point is an error
    copy_logs: bool = MISSING  # copy TensorBoard event files here with every checkpoint


@dataclass
class _ObjectStorageConfig(_StorageConfig):
    # No key or secret fields: credentials come only from the environment / the provider's chain.
    endpoint_url: str | None = MISSING
    check_timeout_s: float = MISSING
    max_attempts: int = MISSING  # tries of every request during the run (litlab.storage.roots)
    timeout_s: float = MISSING  # per try: to connect, between bytes, unacknowledged sends


@dataclass
class _S3StorageConfig(_ObjectStorageConfig):
    region: str | None = MISSING


@dataclass
class _GCSStorageConfig(_ObjectStorageConfig):
    project: str | None = MISSING


@dataclass
class _AzureStorageConfig(_ObjectStorageConfig):
    account_name: str | None = MISSING  # the storage account (not a secret); null: from the environment


@dataclass
class _OomConfig:
    action: str = MISSING  # fail or auto_shrink
    max_shrinks: int = MISSING  # auto_shrink: halvings of the micro-batch at most
    within_steps: int = MISSING  # auto_shrink: only an OOM before this many optimizer steps is retried


@dataclass
class _TuneConfig:
    """Lightning's batch-size finder (``lightning.pytorch.tuner.Tuner.scale_batch_size``)."""

    batch_size: bool = MISSING
    mode: str = MISSING  # power or binsearch
    init_val: int = MISSING
    max_trials: int = MISSING
    steps_per_trial: int = MISSING
    max_val: int = MISSING


@dataclass
class _PathsConfig:
    root_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class _TrainConfig:
    """configs/train.yaml over the engine's defaults (src/litlab/conf/litlab_train.yaml)."""

    trainer: Any = MISSING
    strategy: Any = MISSING
    precision: _PrecisionConfig = MISSING
    callbacks: dict[str, Any] = MISSING
    storage: _StorageConfig = MISSING
    data: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = MISSING
    logger: dict[str, Any] = MISSING
    paths: _PathsConfig = MISSING
    task_name: str = MISSING
    experiment_name: str = MISSING
    run_name: str | None = MISSING
    resume: str = MISSING  # auto, never, or the path/URL of a checkpoint
    seed: int = MISSING
    global_batch_size: int | None = MISSING  # fixes the effective batch; data.batch_size is derived
    compile: bool = MISSING  # torch.compile the LightningModule's forward
    test_after_fit: bool = MISSING
    optimized_metric: str | None = MISSING  # null: the module logs none (docs/contract.md)
    optimized_metric_mode: str = MISSING  # min or max
    on_nonfinite: str = MISSING  # fail or skip
    hang_timeout: float = MISSING  # seconds without progress before the run ends; 0: off
    preempt_grace: float = MISSING  # seconds after SIGTERM to reach a batch boundary
    oom: _OomConfig = MISSING
    tune: _TuneConfig = MISSING


@dataclass
class _EvalConfig:
    """configs/eval.yaml."""

    paths: _PathsConfig = MISSING
    task_name: str = MISSING
    ckpt_path: str = MISSING
    accelerator: str = MISSING
    devices: Any = MISSING


@dataclass
class _PredictConfig(_EvalConfig):
    """configs/predict.yaml: eval's settings, Lightning's strategy and nodes, and ``data=NAME``."""

    strategy: str = MISSING
    num_nodes: int = MISSING
    data: Any = None  # a data group option to predict on instead of the run's data


def register() -> None:
    """Store the schemas in Hydra's ConfigStore and register litlab's resolvers (idempotent)."""
    from litlab.config import resolvers

    resolvers.register()
    store = ConfigStore.instance()
    # An open ``trainer`` node: Hydra closes the whole config before it applies the command line; a
    # node's own flag wins over its parent's, so ``trainer.sync_batchnorm=true`` can set any
    # lightning.Trainer argument that the YAML does not name (the signature check refuses typos).
    train = OmegaConf.structured(_TrainConfig)
    train.trainer = {}
    OmegaConf.set_struct(train.trainer, False)
    store.store(name="litlab_train_schema", node=train)
    store.store(name="litlab_eval_schema", node=_EvalConfig)
    store.store(name="litlab_predict_schema", node=_PredictConfig)
    schemas = [("precision", "default", _PrecisionConfig), ("oom", "default", _OomConfig)]
    schemas += [("storage", "default", _StorageConfig), ("storage", "s3", _S3StorageConfig)]
    schemas += [("storage", "gcs", _GCSStorageConfig), ("storage", "azure", _AzureStorageConfig)]
    for group, name, node in schemas:
        store.store(group=f"schema/{group}", name=name, node=node, package=group)
