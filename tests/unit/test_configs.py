"""Every option of every config group composes, passes the checks, and builds what it names.

In-process: options of your groups (model, data, optimizer, scheduler) and experiments train one
batch of fit, validation and test with a real Trainer (``fast_dev_run``); each option of the
engine's groups builds the run's Trainer (``litlab.run.build.build_trainer``), whose strategy,
precision, callbacks and loggers must be the ones the option names. The options themselves must be
the ones docs/configs.md lists.
"""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from omegaconf import OmegaConf

from litlab.callbacks.combined import CombinedCallbacks, combinable, parts_of
from litlab.config import preflight
from litlab.config.preflight import ENGINE_CONFIG_DIR
from litlab.errors import LitlabError
from litlab.run.build import build_datamodule, build_module, build_trainer
from litlab.run.lifecycle import Run
from litlab.storage.checkpoints import AtomicCheckpointIO
from litlab.storage.roots import RunStorage
from tests.cifar_files import write_cifar10
from tests.conftest import REPO, compose_train, config_groups, option_names
from tests.image_files import write_image_folder

ENGINE_GROUPS = ["trainer", "strategy", "precision", "callbacks", "storage", "logger", "oom", "debug"]
USER_GROUPS = ["data", "model", "optimizer", "scheduler", "experiment"]


def documented_options() -> dict[str, list[str]]:
    """The options docs/configs.md lists for each group (its table), in the order listed."""
    text = (REPO / "docs" / "configs.md").read_text()
    options = {}
    for line in text.split("| --- | --- | --- |", 1)[1].split("\n\n", 1)[0].strip().splitlines():
        groups, listed, _ = (cell.strip() for cell in line.strip("|").split("|", 2))
        for group in re.findall(r"`([\w/]+)`", groups):
            options[group] = re.findall(r"`(\w+)`", listed)
    return options


def test_every_group_has_exactly_the_options_docs_configs_md_lists():
    documented = documented_options()
    folders = config_groups()
    assert folders <= documented.keys(), (
        f"groups without a row in docs/configs.md: {folders - documented.keys()}"
    )
    for group in sorted(folders):
        assert sorted(documented[group]) == option_names(group), group


def test_each_precision_option_sets_the_lightning_value_docs_configs_md_lists():
    table = (REPO / "docs" / "configs.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| `precision` |")]
    _, options, values = (cell.strip() for cell in row.strip("|").split("|"))
    documented = dict(zip(re.findall(r"`(\w+)`", options), re.findall(r"`([\w-]+)`", values), strict=True))
    assert sorted(documented) == option_names("precision")
    for option, value in documented.items():
        assert OmegaConf.load(ENGINE_CONFIG_DIR / "precision" / f"{option}.yaml").value == value, option


# Options of the char_lm example that need each other (its model reads text, not images).
# The other task's option, with its partner and a metric it logs (the preflight refuses val/acc there).
PARTNERS = {
    ("model", "char_transformer"): ["data=pydoc_topics", "optimized_metric=val/loss"],
    ("data", "pydoc_topics"): ["model=char_transformer", "optimized_metric=val/loss"],
}


def overrides_for(group: str, option: str, tmp_path: Path) -> list[str]:
    overrides = [f"{group}={option}"]
    if (group, option) in PARTNERS:
        overrides += PARTNERS[group, option]
    if group == "data" and option == "image_folder":
        overrides.append(f"data.root={write_image_folder(tmp_path / 'images')}")
    if group == "logger" and option == "wandb":
        overrides.append("logger.wandb.offline=true")  # no W&B login here
    if group == "logger" and option in ("mlflow", "many"):
        # A server URI: the client connects on first use only (the SQLite default migrates a database first).
        overrides.append("logger.mlflow.tracking_uri=http://127.0.0.1:9")
    if option.startswith("cifar10"):  # data=cifar10 and experiment=cifar10_resnet: files, no download
        overrides.append(f"data.root={write_cifar10(tmp_path / 'cifar10', images_per_batch=4)}")
    if group == "storage" and option == "mounted":
        overrides.append(f"storage.root={tmp_path}")
    if group == "storage" and option in ("s3", "gcs", "azure"):
        # The run folder's name reads the storage (a finished run?): an endpoint that refuses at once,
        # tried once, not the cloud's, which this offline machine would wait for, retrying.
        root = {"s3": "s3://bucket/x", "gcs": "gs://bucket/x", "azure": "az://container/x"}[option]
        overrides += [f"storage.root={root}", "storage.endpoint_url=http://127.0.0.1:9"]
        overrides.append("storage.max_attempts=1")
    return overrides


# What Lightning runs on this CPU for each precision value (fp16 AMP is not supported there).
CPU_PRECISION = {
    "32-true": "32-true",
    "16-mixed": "bf16-mixed",
    "bf16-mixed": "bf16-mixed",
    "16-true": "16-true",
    "bf16-true": "bf16-true",
}
STRATEGY = {
    "auto": (SingleDeviceStrategy, None),
    "ddp": (DDPStrategy, "popen"),
    "ddp_notebook": (DDPStrategy, "fork"),
}
# The loggers each option builds (docs/loggers.md).
LOGGERS = {
    "tensorboard": ["TensorBoardLogger"],
    "csv": ["CSVLogger"],
    "mlflow": ["MLFlowLogger"],
    "wandb": ["WandbLogger"],
    "many": ["TensorBoardLogger", "CSVLogger", "MLFlowLogger"],
    "none": [],
}
# What each callbacks target builds.
CALLBACKS = {
    "litlab.storage.checkpoints.run_checkpoints": {
        "EpochCheckpoint", "LastCheckpoint", "PreemptionCheckpoint", "TensorBoardSync"
    },
    "litlab.callbacks.progress.progress_bar": {"PlainProgress"},  # RichProgressBar on a terminal
    "litlab.callbacks.run_stats.throughput_monitor": {"ThroughputMonitor"},
    "lightning.pytorch.callbacks.LearningRateMonitor": {"LearningRateMonitor"},
    "lightning.pytorch.callbacks.EarlyStopping": {"EarlyStopping"},
}  # fmt: skip
# Every run has these, whatever its callbacks group: they make the engine's guarantees hold.
ENGINE_CALLBACKS = {
    "RunStats", "NonFiniteLossGuard", "WorldCheck", "ReseedEveryStep", "WholeGlobalBatches",
    "ResumableLoaderCheck", "RunConfigInCheckpoint", "LoggerRuns",
    "RankWatch", "HeartbeatAfterYourCallbacks",
}  # fmt: skip


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in ENGINE_GROUPS for o in option_names(g)], ids=lambda v: str(v)
)
def test_engine_option_composes_and_builds_the_trainer_it_names(group, option, tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    cfg = compose_train(overrides_for(group, option, tmp_path), tmp_path)
    preflight.check_train_config(cfg, [])
    run = Run(dir=tmp_path, identity="walk", storage=RunStorage(str(tmp_path / "storage"), "walk"))
    if cfg.trainer.accelerator == "gpu" and torch.cuda.device_count() == 0:
        with pytest.raises(LitlabError, match=r"trainer.accelerator=gpu .* this machine has 0"):
            build_trainer(cfg, run)
        return
    if cfg.strategy.name == "fsdp":  # FSDP needs a GPU: refused in one line on a CPU
        with pytest.raises(LitlabError, match=r"strategy=fsdp needs GPUs .* trainer.accelerator=cpu"):
            build_trainer(cfg, run)
        return
    trainer = build_trainer(cfg, run)

    strategy, start_method = STRATEGY[cfg.strategy.name]
    assert type(trainer.strategy) is strategy
    assert getattr(trainer.strategy, "_start_method", None) == start_method
    assert trainer.precision == CPU_PRECISION[cfg.precision.value]
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    built = [type(c).__name__ for c in parts_of(trainer.callbacks)]
    assert set(built) >= ENGINE_CALLBACKS, built
    # litlab's and Lightning's callbacks run as one, but for the kinds Lightning finds by type.
    combined = [c for c in trainer.callbacks if isinstance(c, CombinedCallbacks)]
    assert len(combined) == 1 and not any(combinable(c) for c in trainer.callbacks if c not in combined)
    expected = set().union(*(CALLBACKS[c._target_] for c in cfg.callbacks.values() if c is not None))
    if not trainer.loggers:  # a learning-rate monitor logs to a logger: left out without one
        expected.discard("LearningRateMonitor")
    optional = {"ModelSummaryWithMeasuredFlops", "ForkedRankZero"}  # ForkedRankZero: ranks forked from here
    assert set(built) - ENGINE_CALLBACKS - optional == expected, built
    assert run.forks_ranks == ("ForkedRankZero" in built) == (start_method == "fork")
    for callback in parts_of(trainer.callbacks):
        if isinstance(callback, ModelCheckpoint):
            assert callback.dirpath == run.checkpoint_dir  # every checkpoint goes to the run's storage
            if callback.monitor is not None:
                assert (callback.monitor, callback.mode) == (cfg.optimized_metric, cfg.optimized_metric_mode)
        if isinstance(callback, EarlyStopping):
            assert callback.monitor == cfg.optimized_metric and callback.mode == cfg.optimized_metric_mode
    logger_option = option if group == "logger" else "tensorboard"
    # fast_dev_run logs nothing: Lightning puts its DummyLogger in the configured loggers' place.
    loggers = ["DummyLogger"] if cfg.trainer.fast_dev_run else LOGGERS[logger_option]
    assert [type(logger).__name__ for logger in trainer.loggers] == loggers
    # The debug group's switches reach the Trainer.
    switches = (trainer.fast_dev_run, trainer.overfit_batches, trainer._detect_anomaly)
    assert switches == (cfg.trainer.fast_dev_run, cfg.trainer.overfit_batches, cfg.trainer.detect_anomaly)
    assert type(trainer.profiler).__name__ == ("SimpleProfiler" if cfg.trainer.profiler else "NoProfiler")


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


def test_a_file_of_an_engine_group_in_the_forks_configs_overrides_or_adds_an_option(tmp_path):
    # The fork's config folder comes first on Hydra's search path, the engine's groups after it
    # (hydra_plugins/litlab_searchpath.py): the same name overrides, a new name adds.
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "default.yaml").write_text("max_epochs: 99\n")
    (tmp_path / "trainer" / "mine.yaml").write_text("defaults:\n  - gpu\n  - _self_\nmax_epochs: 5\n")
    (tmp_path / "fork.yaml").write_text("defaults:\n  - trainer: default\n  - _self_\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        assert dict(compose("fork").trainer) == {"max_epochs": 99}
        gpu = compose("fork", overrides=["trainer=gpu"]).trainer  # the engine's, on the fork's default
        assert (gpu.accelerator, gpu.benchmark, gpu.max_epochs) == ("gpu", True, 99)
        mine = compose("fork", overrides=["trainer=mine"]).trainer
        assert (mine.accelerator, mine.max_epochs) == ("gpu", 5)


def test_the_engines_settings_default_in_the_engine_and_the_forks_train_yaml_or_command_line_wins(
    tmp_path, monkeypatch
):
    # configs/train.yaml reads as the fork's sentence: the engine's own keys (hang_timeout, tune, ...)
    # have their defaults in the engine's config, which train.yaml names first in its defaults list.
    engine = OmegaConf.load(ENGINE_CONFIG_DIR / "litlab_train.yaml")
    engine_keys = set(engine) - {"defaults"}
    assert {"hang_timeout", "preempt_grace", "tune", "on_nonfinite", "resume"} <= engine_keys
    assert not engine_keys & set(OmegaConf.load(REPO / "configs" / "train.yaml"))
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    cfg = compose_train([], tmp_path)
    assert all(cfg[key] == engine[key] for key in engine_keys)
    assert compose_train(["hang_timeout=5", "tune.mode=binsearch"], tmp_path).tune.mode == "binsearch"
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "train.yaml").write_text("defaults:\n  - litlab_train\n  - _self_\nhang_timeout: 7\n")
    with initialize_config_dir(config_dir=str(fork), version_base="1.3"):
        assert compose("train").hang_timeout == 7
        assert compose("train", overrides=["hang_timeout=5"]).hang_timeout == 5
        assert compose("train").tune.mode == engine.tune.mode
        # The engine's file brings the schema along: a typo fails as it does with configs/train.yaml.
        with pytest.raises(ConfigCompositionException, match="hang_timout"):
            compose("train", overrides=["hang_timout=5"])
