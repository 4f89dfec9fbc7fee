"""Every option of every config group composes, passes the checks, and builds what it names.

In-process: options of your groups (model, data, optimizer, scheduler) and experiments train one
batch of fit, validation and test with a real Trainer (``fast_dev_run``); the engine's groups build
their Lightning objects.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

from litlab.config import preflight
from litlab.config.rules import PRECISION_VALUES
from litlab.run.build import build_callbacks, build_datamodule, build_loggers, build_module, build_strategy
from litlab.run.lifecycle import Run
from litlab.storage.roots import RunStorage
from tests.cifar_files import write_cifar10
from tests.conftest import compose_train, option_names
from tests.image_files import write_image_folder

ENGINE_GROUPS = ["trainer", "strategy", "precision", "callbacks", "storage", "logger", "oom", "debug"]
USER_GROUPS = ["data", "model", "optimizer", "scheduler", "experiment"]


def test_every_group_has_the_documented_options():
    expected = {
        "trainer": {"default", "gpu"},
        "strategy": {"auto", "ddp", "ddp_spawn", "fsdp"},
        "precision": {"fp32", "fp16", "bf16", "fp16_true", "bf16_true"},
        "callbacks": {
            "default",
            "none",
            "early_stopping",
            "checkpoint",
            "throughput",
            "lr_monitor",
            "progress",
        },
        "data": {"digits", "synthetic", "image_folder", "cifar10", "pydoc_topics"},
        "model": {"mlp", "cnn", "resnet", "char_transformer"},
        "optimizer": {"adamw", "sgd"},
        "scheduler": {"none", "cosine", "exponential", "onecycle"},
        "logger": {"tensorboard", "csv", "none", "mlflow", "wandb", "many"},
        "debug": {"fast", "overfit", "profile", "anomaly"},
        "storage": {"local", "mounted", "s3", "gcs"},
        "oom": {"fail", "auto_shrink"},
    }
    for group, names in expected.items():
        assert names <= set(option_names(group)), group


# Options of the char_lm example that need each other (its model reads text, not images).
PARTNERS = {
    ("model", "char_transformer"): "data=pydoc_topics",
    ("data", "pydoc_topics"): "model=char_transformer",
}


def overrides_for(group: str, option: str, tmp_path: Path) -> list[str]:
    overrides = [f"{group}={option}"]
    if (group, option) in PARTNERS:
        overrides.append(PARTNERS[group, option])
    if group == "data" and option == "image_folder":
        overrides.append(f"data.root={write_image_folder(tmp_path / 'images')}")
    if group == "logger" and option == "wandb":
        overrides.append("logger.wandb.offline=true")  # no W&B login here
    if group == "logger" and option in ("mlflow", "many"):
        # A server URI: the client connects on first use only (the SQLite default migrates a database first).
        overrides.append("logger.mlflow.tracking_uri=http://127.0.0.1:9")
    if option.startswith("cifar10"):  # data=cifar10 and experiment=cifar10_resnet: files, no download
        overrides.append(f"data.root={write_cifar10(tmp_path / 'cifar10', images_per_batch=4)}")
    if group == "storage" and option in ("s3", "gcs", "mounted"):
        overrides.append(
            {"s3": "storage.root=s3://bucket/x", "gcs": "storage.root=gs://bucket/x"}.get(
                option, f"storage.root={tmp_path}"
            )
        )
    return overrides


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in ENGINE_GROUPS for o in option_names(g)], ids=lambda v: str(v)
)
def test_engine_option_composes_and_builds_its_lightning_objects(group, option, tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    cfg = compose_train(overrides_for(group, option, tmp_path), tmp_path)
    preflight.check_train_config(cfg, [])
    run = Run(dir=tmp_path, identity="walk", storage=RunStorage(str(tmp_path / "storage"), "walk"))
    strategy = build_strategy(cfg.strategy)
    assert strategy == "auto" or type(strategy).__name__.lower().startswith(cfg.strategy.name.split("_")[0])
    callbacks = build_callbacks(cfg, run)
    assert callbacks and all(isinstance(c, Callback) for c in callbacks)
    loggers = build_loggers(cfg)
    assert loggers is False or all(isinstance(logger, Logger) for logger in loggers)
    assert len(loggers or []) == len([c for c in cfg.logger.values() if c is not None])
    assert cfg.precision.value in PRECISION_VALUES


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in USER_GROUPS for o in option_names(g)], ids=lambda v: str(v)
)
def test_option_of_your_groups_trains_one_batch(group, option, tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    cfg = compose_train(overrides_for(group, option, tmp_path), tmp_path)
    preflight.check_train_config(cfg, [])
    data = build_datamodule(cfg, 8)
    module = build_module(cfg)
    trainer = L.Trainer(
        fast_dev_run=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    trainer.test(module, datamodule=data, verbose=False)
    assert trainer.global_step == 1
    assert {k for k in trainer.callback_metrics if k.startswith("test/")}, trainer.callback_metrics
    assert all(torch.isfinite(p).all() for p in module.parameters())
