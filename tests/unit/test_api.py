"""``litlab.train`` and ``litlab.compose``: a run as a Python function, in this process, with what
``litlab-train`` gives (run directory, .hydra/, train.log, storage, resume) and its summary returned."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest

import litlab
from litlab.config.rules import ConfigError
from litlab.errors import LitlabError
from project.vision.module import ImageClassifier
from tests.conftest import REPO, TINY

# Lightning's demo classes, as LightningCLI trains them (tests/configs/model/boring.yaml, data/boring.yaml).
BORING = [f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]", "model=boring", "data=boring"]


def overrides(tmp_path: Path, name: str = "run", *more: str) -> list[str]:
    return [
        *TINY,
        "model=mlp",
        f"paths.log_dir={tmp_path / 'logs'}",
        f"hydra.run.dir={tmp_path / name}",
        *more,
    ]


def test_train_returns_the_summary_and_a_second_call_finds_the_completed_run(tmp_path):
    summary = litlab.train(overrides(tmp_path))
    assert summary["status"] == "completed" and summary["groups"]["model"] == "mlp"
    assert 0.0 <= summary["metrics"]["test/acc"] <= 1.0
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()
    assert "test/acc" in (tmp_path / "run" / "train.log").read_text()

    again = litlab.train(overrides(tmp_path, "again"))  # the same command: the run is already complete
    assert again["status"] == "completed" and again["metrics"] == summary["metrics"]
    assert "already completed" in (tmp_path / "again" / "train.log").read_text()


def test_a_composed_config_can_be_changed_before_it_trains(tmp_path):
    cfg = litlab.compose(overrides(tmp_path))
    assert cfg.trainer.max_epochs == 1 and cfg.model.net._target_.endswith("MLP")
    cfg.trainer.max_epochs = 2
    summary = litlab.train(cfg)
    assert summary["status"] == "completed" and summary["epochs"] == 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["model=mlpp"], "'mlpp' is not an option of group 'model': choose one of"),
        (["trainer.max_epoch=3"], "unknown key 'trainer.max_epoch'"),
        (["precision=fp32,bf16"], "is a sweep: litlab.train trains one run"),
        (["trainer.devices=2", "strategy=ddp"], "strategy=ddp: litlab.train trains in this process; several"),
        # Removed: its spawned ranks never told the launching process their progress (ddp_notebook does).
        (["strategy=ddp_spawn"], "'ddp_spawn' is not an option of group 'strategy': choose one of"),
        # What needs a batch_size or a metric, refused for a task that has none.
        (
            [*BORING, "optimized_metric=null", "global_batch_size=64"],
            "global_batch_size=64 needs data.batch_size: it sets the micro-batch it derives, and your data "
            "config (lightning.pytorch.demos.boring_classes.BoringDataModule) has no batch_size",
        ),
        (
            [*BORING, "optimized_metric=null", "callbacks=early_stopping"],
            "optimized_metric=null: callbacks.early_stopping (EarlyStopping) follows it; set",
        ),
    ],
)
def test_bad_input_raises_the_commands_one_line_and_writes_nothing(bad, message, tmp_path):
    with pytest.raises(ConfigError, match="^" if message.startswith("'") else "") as error:
        litlab.train(overrides(tmp_path, "run", *bad))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()
    assert not [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]  # no run, no checkpoint


def test_the_callers_logging_is_back_after_the_run(tmp_path, caplog):
    import logging

    litlab.train(overrides(tmp_path))
    logging.getLogger("litlab").warning("after the run")  # a notebook's own logging goes on
    assert "after the run" in caplog.text
    assert "after the run" not in (tmp_path / "run" / "train.log").read_text()


def test_a_password_typed_for_a_single_run_reaches_no_file_and_the_run_uses_it(tmp_path):
    before = set(os.environ)
    prefix = "http://alice:Pw0rdX@example.com/"
    try:
        summary = litlab.train(overrides(tmp_path, "run", "logger=csv", f"+logger.csv.prefix={prefix}"))
        assert summary["status"] == "completed"
        written = [p for p in tmp_path.rglob("*") if p.is_file() and b"Pw0rdX" in p.read_bytes()]
        assert written == [], "a typed password reached these files"
        # The run trained with the value: it came through the environment, not through a file.
        assert "alice:Pw0rdX" in os.environ.values()  # the user-info alone
    finally:
        for name in set(os.environ) - before:  # the variables it set end with the test
            del os.environ[name]


def test_lightnings_demo_module_and_datamodule_train_without_a_batch_size_or_a_metric(tmp_path):
    # BoringDataModule takes no batch_size; BoringModel logs no metric (optimized_metric=null).
    summary = litlab.train(overrides(tmp_path, "run", *BORING, "optimized_metric=null"))
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert (summary["micro_batch_size"], summary["effective_batch_size"]) == (None, None)
    assert summary["optimized_metric"] is None
    assert summary["checkpoints"]["tested"] == summary["checkpoints"]["best"]  # the last epoch's
    log = (tmp_path / "run" / "train.log").read_text()
    assert "data=boring has no batch_size: its datamodule sizes its own batches" in log
    assert "optimized_metric=null: checkpoints keep the last epoch's, not the best by a metric" in log


def test_debug_fast_runs_one_batch_of_train_val_and_test(tmp_path):
    summary = litlab.train(overrides(tmp_path, "run", "debug=fast"))
    assert summary["status"] == "completed" and summary["global_step"] == 1
    assert {"train/loss", "val/acc", "test/acc"} <= set(summary["metrics"])


class OptimizerCalledAsAPartial(ImageClassifier):
    """configure_optimizers as docs/your-task.md once said: the optimizer group's config, called."""

    def configure_optimizers(self):
        return self.hparams.optimizer(self.parameters())


def test_an_error_in_your_configure_optimizers_is_one_line_naming_the_class_and_the_call(tmp_path):
    target = f"model._target_={__name__}.OptimizerCalledAsAPartial"
    with pytest.raises(LitlabError) as error:
        litlab.train(overrides(tmp_path, "run", target))
    line = inspect.getsourcelines(OptimizerCalledAsAPartial.configure_optimizers)[1] + 1
    assert error.value.reason == (
        "OptimizerCalledAsAPartial.configure_optimizers raised TypeError: 'dict' object is not callable at "
        f"test_api.py:{line} `return self.hparams.optimizer(self.parameters())`: with _recursive_: false the "
        "optimizer arrives as config, which hydra.utils.instantiate(self.hparams.optimizer)"
        "(self.parameters()) builds (docs/your-task.md)"
    )
