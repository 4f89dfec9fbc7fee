"""Loggers that cannot run say so in one line: a missing optional package names its pip install, a
W&B run without a login names the two ways out. (tests/integration/test_loggers.py logs for real.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, Logger
from omegaconf import OmegaConf

from litlab.cli.api import train_run
from litlab.errors import LitlabError
from litlab.run.build import build_loggers
from litlab.run.loggers import check_wandb_login, credential_arguments
from tests.conftest import REPO, TINY, compose_train


def test_a_logger_whose_package_is_missing_names_the_pip_install(tmp_path, monkeypatch):
    import lightning.pytorch.loggers.mlflow as mlflow_logger
    from lightning_utilities.core.imports import RequirementCache

    # Lightning's own check of the package, as it reads where mlflow is not installed.
    monkeypatch.setattr(mlflow_logger, "_MLFLOW_AVAILABLE", RequirementCache("mlflow>=999"))
    cfg = compose_train(["logger=many"], tmp_path)
    with pytest.raises(LitlabError) as caught:
        build_loggers(cfg)
    assert str(caught.value) == (
        "litlab: error: logger.mlflow (lightning.pytorch.loggers.MLFlowLogger) needs a package that is "
        "not installed: pip install 'litlab[mlflow]' (or pip install mlflow)"
    )


def test_a_wandb_run_without_a_login_fails_in_one_line(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.chdir(tmp_path)  # no ./wandb/settings
    wandb.teardown()  # settings wandb read earlier in this process (another test's offline mode)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tiny = [t for t in TINY if not t.startswith("logger=")]
    cfg = compose_train([f"paths.log_dir={tmp_path / 'logs'}", "logger=wandb", *tiny], run_dir)
    with pytest.raises(LitlabError) as caught:
        train_run(cfg)
    reason = caught.value.reason
    assert reason == (
        "logger=wandb needs a W&B login: run `wandb login` (or set WANDB_API_KEY), or set "
        "WANDB_MODE=offline to keep the runs on this machine (`wandb sync` uploads them later)"
    )
    assert not list((tmp_path / "logs").rglob("*.ckpt"))  # it stopped before training


def test_every_wandb_command_of_the_loggers_page_runs_without_a_login(tmp_path, monkeypatch):
    # A sweep of such a command would fail every job: each sets what runs without an account.
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.chdir(tmp_path)  # no ./wandb/settings
    block = re.search(r"```bash\n(.*?)```", (REPO / "docs" / "loggers.md").read_text(), re.S)
    commands = [line.split("  #")[0] for line in block.group(1).splitlines() if "wandb" in line]
    assert len(commands) == 3
    for command in commands:
        words = shlex.split(command)
        start = words.index("litlab-train")
        with monkeypatch.context() as scoped:
            for setting in words[:start]:  # VAR=value before the command
                scoped.setenv(*setting.split("=", 1))
            wandb.teardown()  # wandb reads its settings again
            cfg = compose_train([w for w in words[start:] if w.startswith("logger=")], tmp_path)
            for logger_cfg in cfg.logger.values():
                check_wandb_login(logger_cfg)
    wandb.teardown()


class RecordingLogger(Logger):
    """A logger class of the user's own (any ``logger.<name>._target_``): it keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.hyperparameters: list[dict] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.hyperparameters.append(dict(params))

    def log_metrics(self, metrics, step=None) -> None:
        pass


class _SavesItsSecrets(BoringModel):
    def __init__(self, password: str = "hunter2", url: str = "http://me:pw@host/db", width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_every_configured_logger_gets_the_hyperparameters_redacted_and_the_module_keeps_them(tmp_path):
    cfg = compose_train(["logger=csv", f"+logger.mine._target_={__name__}.RecordingLogger"], tmp_path)
    csv, mine = build_loggers(cfg)
    assert isinstance(csv, CSVLogger) and type(csv).__name__ == "CSVLogger"
    assert isinstance(mine, RecordingLogger)
    module = _SavesItsSecrets()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, logger=[csv, mine], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module)
    redacted = {"password": "***", "url": "http://***@host/db", "width": 32}
    assert mine.hyperparameters == [redacted]  # what Lightning logs when fitting starts
    written = (Path(csv.log_dir) / "hparams.yaml").read_text()
    assert "hunter2" not in written and ":pw@" not in written and "password: '***'" in written
    assert module.hparams == {"password": "hunter2", "url": "http://me:pw@host/db", "width": 32}


def test_a_metric_prefix_is_written_without_a_urls_user_info():
    """Every logger writes its ``prefix`` into each metric's name (metrics.csv's header)."""
    csv = OmegaConf.create({"_target_": "lightning.pytorch.loggers.CSVLogger", "prefix": "http://a:pw@h/"})
    assert credential_arguments(csv) == {"prefix": "http://***@h/"}
    assert credential_arguments(OmegaConf.create({"_target_": "x.CSVLogger", "prefix": "run-"})) == {}
