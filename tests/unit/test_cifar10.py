"""``data=cifar10`` on a small CIFAR-10 that the test writes in CIFAR-10's own python format
(tests/cifar_files.py): torchvision reads it, nothing is downloaded, the resnet and cnn models train on it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from litlab.cli import preflight
from litlab.data import TensorBatches
from litlab.errors import LitlabError
from project.vision.cifar10 import FOLDER, CIFAR10DataModule, crop_and_flip
from tests.cifar_files import write_cifar10
from tests.conftest import TINY, run_dirs, train_in_process
from tests.s3_server import free_port


def test_cifar10_is_read_from_its_own_format_and_split_without_a_download(tmp_path):
    root = write_cifar10(tmp_path / "data", images_per_batch=40)
    data = CIFAR10DataModule(str(root), download=True, val_fraction=0.1)
    data.prepare_data()  # the files are there: nothing to download
    data.setup()
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == sorted(
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    )
    sizes = {split: len(labels) for split, (_, labels) in data.splits.items()}
    assert sizes == {"train": 180, "val": 20, "test": 40}  # 5 x 40 training images, 40 test images
    train_images, _ = data.splits["train"]
    assert train_images.shape[1:] == (3, 32, 32)
    # Standardised per channel with the training split's statistics.
    assert torch.allclose(train_images.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(train_images.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)
    test = pickle.loads((root / FOLDER / "test_batch").read_bytes())
    assert data.splits["test"][1].tolist() == test["labels"]  # the official test split, in order


def test_without_its_files_and_with_download_false_it_fails_before_any_run(tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match=r"holds no CIFAR-10 .*set data.download=true"):
        CIFAR10DataModule(str(tmp_path), download=False)
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(SystemExit) as exited:
        preflight.check_or_exit("train", ["data=cifar10", f"data.root={tmp_path}", "data.download=false"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"litlab: error: data=cifar10: data.root={tmp_path} holds no CIFAR-10")
    assert run_dirs(tmp_path / "logs") == []  # no run folder


def test_a_download_that_fails_ends_in_one_line_saying_where_to_put_the_files(tmp_path, monkeypatch):
    # Offline, as on a machine without internet: nothing answers at the archive's address.
    url = f"http://127.0.0.1:{free_port()}/cifar-10-python.tar.gz"
    monkeypatch.setattr("torchvision.datasets.CIFAR10.url", url)
    root = tmp_path / "data"
    with pytest.raises(LitlabError) as error:
        train_in_process(tmp_path, "data=cifar10", f"data.root={root}", *TINY)
    line = str(error.value)
    assert line.startswith(
        f"litlab: error: data=cifar10: CIFAR-10 could not be downloaded into data.root={root} ("
    )
    assert line.endswith(
        f"put {FOLDER}/ (unpacked from {url}) there, or point data.root (or LITLAB_DATA_DIR, its "
        "default) at a folder that holds it"
    )


def test_crop_and_flip_draws_for_each_image_and_repeats_with_the_seed():
    images = torch.arange(3 * 32 * 32, dtype=torch.float32).reshape(1, 3, 32, 32).repeat(16, 1, 1, 1)
    loader = TensorBatches((images, torch.zeros(16)), 16, shuffle=False, seed=3, transform=crop_and_flip)
    (first,), (again,) = ([batch[0] for batch in loader] for _ in range(2))
    assert torch.equal(first, again)  # TensorBatches seeds the draw per batch
    distinct = {tuple(image.flatten().tolist()) for image in first}
    assert len(distinct) > 8  # 16 copies of one image, cropped and flipped each on its own
    # A crop is a shifted window of the zero-padded image: every value is the image's or padding.
    assert set(first.unique().tolist()) <= set(images.unique().tolist()) | {0.0}


@pytest.mark.parametrize("model", ["cnn", "resnet"])
def test_cnn_and_resnet_train_on_cifar10(model, tmp_path):
    root = write_cifar10(tmp_path / "data", images_per_batch=20)
    overrides = ["data=cifar10", f"data.root={root}", "data.batch_size=8", f"model={model}", *TINY]
    summary = train_in_process(tmp_path, *overrides)
    assert summary["status"] == "completed" and summary["groups"]["data"] == "cifar10"
    assert summary["global_step"] == 4 and summary["micro_batch_size"] == 8
    assert np.isfinite(summary["metrics"]["test/loss"]) and len(summary["history"]) == 1
