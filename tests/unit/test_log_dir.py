"""Where runs go (``paths.log_dir``): ``LITLAB_LOG_DIR``, or ``logs/`` where litlab runs. A variable
set to nothing, as job templates often leave it, counts as unset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import compose_train


@pytest.mark.parametrize("value", [None, ""])
def test_an_unset_or_empty_litlab_log_dir_is_the_default_logs_folder(tmp_path, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("LITLAB_LOG_DIR", raising=False)
    else:
        monkeypatch.setenv("LITLAB_LOG_DIR", value)
    cfg = compose_train(["model=mlp"], tmp_path / "run")
    expected = Path(os.getcwd()) / "logs"
    assert cfg.paths.log_dir == str(expected)
    assert cfg.storage.root == str(expected / "train" / "runs")  # never /train/runs at the root


def test_litlab_log_dir_moves_every_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path / "elsewhere"))
    cfg = compose_train(["model=mlp"], tmp_path / "run")
    assert cfg.storage.root == str(tmp_path / "elsewhere" / "train" / "runs")
