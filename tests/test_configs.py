"""Every option of every config group composes, and its objects instantiate."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from litlab import schema
from litlab.preflight import CONFIG_DIR
from tests.image_files import write_image_folder

schema.register()

GROUPS = [
    "trainer",
    "strategy",
    "precision",
    "callbacks",
    "storage",
    "data",
    "model",
    "optimizer",
    "scheduler",
    "logger",
    "debug",
    "experiment",
    "oom",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def compose_train(overrides: list[str], output_dir: Path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_every_group_has_the_documented_options():
    expected = {
        "trainer": {"default", "gpu"},
        "strategy": {"auto", "ddp", "ddp_spawn", "fsdp"},
        "precision": {"fp32", "fp16", "bf16", "fp16_true", "bf16_true"},
        "callbacks": {"default", "none", "early_stopping", "checkpoint", "throughput"},
        "data": {"digits", "synthetic", "image_folder"},
        "model": {"mlp", "cnn", "resnet"},
        "optimizer": {"adamw", "sgd"},
        "scheduler": {"none", "cosine", "exponential", "onecycle"},
        "logger": {"tensorboard", "csv", "none"},
        "debug": {"fast", "overfit", "profile", "anomaly"},
        "storage": {"local"},
        "oom": {"fail", "auto_shrink"},
    }
    for group, names in expected.items():
        assert names <= set(options(group)), group


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)], ids=lambda v: str(v))
def test_option_composes_and_instantiates(group: str, option: str, tmp_path: Path, monkeypatch):
    import torch
    from hydra.utils import instantiate

    from litlab.build import (
        build_callbacks,
        build_datamodule,
        build_loggers,
        build_module,
        build_strategy,
    )
    from litlab.run import Run
    from litlab.storage import RunStorage

    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    overrides = [f"{group}={option}"]
    if group == "model" and option == "resnet":
        overrides.append("data=synthetic")  # resnet wants more than 8x8 pixels to be meaningful
    if group == "data" and option == "image_folder":
        overrides.append(f"data.root={write_image_folder(tmp_path / 'images')}")
    cfg = compose_train(overrides, tmp_path)
    schema.check(cfg)

    run = Run(dir=tmp_path, identity="walk", storage=RunStorage(str(tmp_path / "storage"), "walk"))
    build_strategy(cfg.strategy)
    build_callbacks(cfg, run)
    build_loggers(cfg)
    assert cfg.precision.value in schema.PRECISION_VALUES

    data = build_datamodule(cfg.data, cfg.data.batch_size)
    data.setup("fit")
    module = build_module(cfg, total_steps=10)
    images, labels = next(iter(data.train_dataloader()))
    logits = module(images)
    assert logits.shape == (len(labels), cfg.data.num_classes)

    optimizer_config = module.configure_optimizers()
    optimizer = optimizer_config["optimizer"] if isinstance(optimizer_config, dict) else optimizer_config
    assert isinstance(optimizer, torch.optim.Optimizer)
    if cfg.data.augment:
        [instantiate(t) for t in cfg.data.augment]
