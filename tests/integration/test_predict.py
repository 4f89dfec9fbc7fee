"""``litlab-predict devices=2``: two CPU ranks (Lightning's DDP, gloo) each predict their share of the
test split, and rank 0 writes every sample's prediction exactly once, the same as one device writes.
One device, the examples' formats and the error lines: tests/unit/test_predict.py."""

from __future__ import annotations

import csv
import sys

import pytest

from litlab.cli import predict
from project.vision.data import DigitsDataModule
from tests.conftest import TINY, litlab, logged, ok, ranks_that_joined, run_dirs, train_in_process

pytestmark = pytest.mark.slow


def test_two_ranks_predict_every_sample_once_as_one_device_does(log_dir, tmp_path, monkeypatch):
    summary = train_in_process(tmp_path, "model=mlp", *TINY, "test_after_fit=false")
    checkpoint = summary["checkpoints"]["last"]
    ok(litlab("litlab-predict", f"ckpt_path={checkpoint}", "devices=2"))
    (run_dir,) = run_dirs(log_dir, "predict")
    assert ranks_that_joined(run_dir) == ["0 1/2", "1 2/2"]
    assert len(logged(run_dir, "has no predict_dataloader: predicting its test split")) == 1  # not per rank
    table = (run_dir / "predictions.csv").read_text()
    indices = [int(row["index"]) for row in csv.DictReader(table.splitlines())]
    data = DigitsDataModule()
    data.setup()
    count = len(data.splits["test"][1])
    assert count % 2 == 1  # an odd split: one rank holds a sample more, and none is padded or repeated
    assert indices == list(range(count))
    # One device, in this process: the same file, byte for byte.
    alone = tmp_path / "alone"
    monkeypatch.setattr(sys, "argv", ["litlab-predict", f"ckpt_path={checkpoint}", f"hydra.run.dir={alone}"])
    predict.main()
    assert (alone / "predictions.csv").read_text() == table
