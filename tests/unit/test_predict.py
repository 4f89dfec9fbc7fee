"""``litlab-predict`` in this process, as its console script runs it, on checkpoints trained here once
per module: both examples' predictions in files read without litlab (csv, ``torch.load``), the one
line when the test split stands in for a missing predict_dataloader, Lightning's default forward for a
module without predict_step, ``data=NAME``, and the one line for a datamodule with nothing to predict.
Several ranks: tests/integration/test_predict.py.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from litlab.callbacks.prediction_files import PredictionFiles
from litlab.cli import predict
from litlab.errors import LitlabError
from project.char_lm.data import CharCorpus, decode
from project.char_lm.module import CharLM
from project.splits import seeded_splits
from project.vision.data import DigitsDataModule
from project.vision.module import ImageClassifier
from tests.conftest import TINY, train_in_process

FALLBACK = "has no predict_dataloader: predicting its test split (test_dataloader)"
ADD_PREDICT_STEP = (
    "add `def predict_step(self, batch, batch_idx)` to {name}, returning the batch's predictions (a "
    "tensor, or a dict of them, one per sample): `x, _ = batch; return self(x)` for (x, y) batches "
    "(docs/your-task.md)"
)


@pytest.fixture(scope="module")
def digits_checkpoint(tmp_path_factory) -> str:
    summary = train_in_process(tmp_path_factory.mktemp("digits"), "model=mlp", *TINY, "test_after_fit=false")
    return summary["checkpoints"]["last"]


@pytest.fixture(scope="module")
def char_lm_checkpoint(tmp_path_factory) -> str:
    small = ["model.net.layers=1", "model.net.heads=2", "model.net.head_width=8", "data.block_size=16"]
    # A test split of 54 sequences: greedy generation runs the network once per character.
    summary = train_in_process(
        tmp_path_factory.mktemp("char_lm"),
        "experiment=char_lm",
        *small,
        "data.test_fraction=0.002",
        *TINY,
        "test_after_fit=false",
    )
    return summary["checkpoints"]["last"]


@pytest.fixture
def run_predict(tmp_path, monkeypatch, capsys):
    """``litlab-predict ARGS`` in this process: its exit status, run directory and stderr."""

    def run(*args: str) -> tuple[int, Path, str]:
        run_dir = tmp_path / "predict"
        monkeypatch.setattr(sys, "argv", ["litlab-predict", *args, f"hydra.run.dir={run_dir}"])
        monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path / "logs"))
        code = 0
        try:
            predict.main()
        except SystemExit as stop:
            code = stop.code
        return code, run_dir, capsys.readouterr().err

    return run


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "predictions.csv").open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def changed_checkpoint(checkpoint: str, tmp_path: Path, section: str, target: str) -> str:
    """A copy of ``checkpoint`` whose run config builds ``target`` for ``section`` (model or data)."""
    content = torch.load(checkpoint, weights_only=True)
    content["litlab"]["config"][section]["_target_"] = target
    path = tmp_path / "changed.ckpt"
    torch.save(content, path)
    return str(path)


def test_digits_predictions_are_each_test_images_class_probabilities(
    digits_checkpoint, run_predict, tmp_path
):
    code, run_dir, _ = run_predict(f"ckpt_path={digits_checkpoint}")
    assert code == 0
    assert f"DigitsDataModule {FALLBACK}" in (run_dir / "train.log").read_text()
    # What the trained model gives for each test image, computed here without litlab.
    data = DigitsDataModule()
    data.setup()
    images = data.splits["test"][0]
    model = ImageClassifier.load_from_checkpoint(digits_checkpoint, weights_only=True).eval()
    with torch.no_grad():
        expected = model(images).softmax(dim=1)
    tensors = torch.load(run_dir / "predictions.pt", weights_only=True)
    assert sorted(tensors) == ["class", "index", "probability"]
    assert tensors["index"].tolist() == list(range(len(images)))  # every test image once, in order
    torch.testing.assert_close(tensors["probability"], expected)
    assert torch.equal(tensors["class"], expected.argmax(dim=1))
    table = rows(run_dir)
    names = [f"probability_{k}" for k in range(10)]
    assert list(table[0]) == ["index", "class", *names]
    assert [int(row["index"]) for row in table] == tensors["index"].tolist()
    assert [int(row["class"]) for row in table] == tensors["class"].tolist()
    read = torch.tensor([[float(row[name]) for name in names] for row in table])
    torch.testing.assert_close(read, tensors["probability"])  # the text keeps float32's digits


def test_char_lm_predictions_are_each_prompts_greedy_continuation(char_lm_checkpoint, run_predict, tmp_path):
    code, run_dir, _ = run_predict(f"ckpt_path={char_lm_checkpoint}")
    assert code == 0
    assert f"CharCorpus {FALLBACK}" in (run_dir / "train.log").read_text()
    assert not (run_dir / "predictions.pt").exists()  # text only: nothing for a tensor file
    data = CharCorpus(block_size=16, test_fraction=0.002)
    data.setup()
    sequences = data.splits["test"]
    table = rows(run_dir)
    assert list(table[0]) == ["index", "prompt", "generated"]
    assert [int(row["index"]) for row in table] == list(range(len(sequences)))
    # The prompt is the sequence's first half; the continuation fills it to the sequence's length, and
    # its first character is the trained model's most likely next one.
    model = CharLM.load_from_checkpoint(char_lm_checkpoint, weights_only=True).eval()
    for row, sequence in zip(table, sequences, strict=True):
        assert row["prompt"] == decode(sequence[:8])
        assert len(row["generated"]) == 17 - 8
    with torch.no_grad():
        first = model(sequences[:, :8])[:, -1].argmax(dim=-1)
    assert [row["generated"][0] for row in table] == [chr(t) for t in first.tolist()]


class ForwardOnly(ImageClassifier):
    """An ImageClassifier without predict_step: Lightning's default calls forward on the whole batch."""

    predict_step = L.LightningModule.predict_step

    def forward(self, batch):
        return super().forward(batch[0] if isinstance(batch, (tuple, list)) else batch)


def test_a_module_without_predict_step_predicts_its_forward_on_the_data_named(
    digits_checkpoint, run_predict, tmp_path
):
    checkpoint = changed_checkpoint(digits_checkpoint, tmp_path, "model", f"{__name__}.ForwardOnly")
    # data=digits replaces the run's data config: a larger test split than the run's.
    args = [f"ckpt_path={checkpoint}", "data=digits", "data.test_fraction=0.2"]
    code, run_dir, _ = run_predict(*args)
    assert code == 0
    assert (
        "ForwardOnly has no predict_step: Lightning's default calls forward"
        in (run_dir / "train.log").read_text()
    )
    data = DigitsDataModule(test_fraction=0.2)
    data.setup()
    images = data.splits["test"][0]
    assert len(images) == len(seeded_splits(1797, 0.15, 0.2, 0)["test"])
    model = ImageClassifier.load_from_checkpoint(digits_checkpoint, weights_only=True).eval()
    tensors = torch.load(run_dir / "predictions.pt", weights_only=True)
    assert tensors["index"].tolist() == list(range(len(images)))
    with torch.no_grad():
        torch.testing.assert_close(tensors["prediction"], model(images))  # the logits, as forward gives them
    assert list(rows(run_dir)[0]) == ["index", *(f"prediction_{k}" for k in range(10))]


class NeitherPredictStepNorForward(ImageClassifier):
    """A module as the Lightning docs often show one: its steps call the network, no forward."""

    predict_step = L.LightningModule.predict_step
    forward = L.LightningModule.forward


def test_a_module_with_neither_predict_step_nor_forward_is_told_what_to_add(
    digits_checkpoint, run_predict, tmp_path
):
    checkpoint = changed_checkpoint(
        digits_checkpoint, tmp_path, "model", f"{__name__}.NeitherPredictStepNorForward"
    )
    code, run_dir, err = run_predict(f"ckpt_path={checkpoint}")
    assert code == 2
    assert err.splitlines()[-1] == (
        "litlab: error: NeitherPredictStepNorForward has neither predict_step nor forward, so litlab-predict "
        f"has nothing to call: {ADD_PREDICT_STEP.format(name='NeitherPredictStepNorForward')}"
    )
    assert not run_dir.exists()


def test_a_checkpoint_of_another_task_with_this_tasks_data_ends_in_one_line(char_lm_checkpoint, run_predict):
    code, run_dir, err = run_predict(f"ckpt_path={char_lm_checkpoint}", "data=digits")
    assert code == 2
    assert err.splitlines()[-1] == (
        f"litlab: error: data=digits does not fit model=char_transformer of ckpt_path={char_lm_checkpoint}, "
        "trained on data=pydoc_topics (AttributeError: 'DigitsDataModule' object has no attribute "
        "'vocab_size'): predict on data of the task it was trained on"
    )
    assert not run_dir.exists()


class PredictsWithADataLoader(DigitsDataModule):
    """The digits, whose predict_dataloader is a torch DataLoader of the test images (no labels)."""

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.splits["test"][0]), batch_size=50)


def test_a_predict_dataloader_is_predicted_with_the_indices_lightning_tracks(
    digits_checkpoint, run_predict, tmp_path
):
    checkpoint = changed_checkpoint(
        digits_checkpoint, tmp_path, "data", f"{__name__}.PredictsWithADataLoader"
    )
    code, run_dir, _ = run_predict(f"ckpt_path={checkpoint}")
    assert code == 0
    assert FALLBACK not in (run_dir / "train.log").read_text()
    data = DigitsDataModule()
    data.setup()
    images = data.splits["test"][0]
    model = ImageClassifier.load_from_checkpoint(digits_checkpoint, weights_only=True).eval()
    tensors = torch.load(run_dir / "predictions.pt", weights_only=True)
    assert tensors["index"].tolist() == list(range(len(images)))
    with torch.no_grad():
        torch.testing.assert_close(tensors["probability"], model(images).softmax(dim=1))


class TrainOnly(DigitsDataModule):
    """A datamodule with nothing to predict: no predict_dataloader, and Lightning's test_dataloader."""

    test_dataloader = L.LightningDataModule.test_dataloader


def test_a_datamodule_with_nothing_to_predict_ends_in_one_line(digits_checkpoint, run_predict, tmp_path):
    checkpoint = changed_checkpoint(digits_checkpoint, tmp_path, "data", f"{__name__}.TrainOnly")
    code, run_dir, err = run_predict(f"ckpt_path={checkpoint}")
    assert code == 2
    assert err.splitlines()[-1] == (
        "litlab: error: TrainOnly has no predict_dataloader and no test_dataloader: litlab-predict has no "
        "data to predict; define predict_dataloader in your datamodule (docs/contract.md), or pick other "
        "data with data=NAME"
    )
    assert not run_dir.exists()  # bad input leaves nothing behind


def test_predictions_of_different_shapes_across_batches_end_in_one_line(tmp_path):
    # Generated sequences of different lengths: torch.cat would raise a traceback, not one line.
    writer = PredictionFiles(tmp_path, "test")
    parts = [([0, 1], [0, 0], {"generated": [torch.zeros(1, 3), torch.zeros(1, 4)]})]
    with pytest.raises(LitlabError, match="predict_step returned generated of different shapes"):
        writer.write(parts)
    assert not list(tmp_path.iterdir())
