"""data=image_folder: a folder of PNG files per class trains like any other dataset."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY, litlab, ok, run_dirs, summary
from tests.image_files import write_image_folder


def test_image_folder_trains_on_png_files_and_counts_its_classes(log_dir, tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=10, size=8)
    ok(
        litlab(
            "litlab-train",
            "data=image_folder",
            f"data.root={root}",
            "data.image_shape=[3,8,8]",
            "data.batch_size=4",
            *TINY,
        )
    )
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "completed" and outcome["groups"]["data"] == "image_folder"
    assert "test/acc" in outcome["metrics"]
    # 30 images: 15% test, 15% val, the rest train; 3 class folders become num_classes=3.
    assert "data image_folder: 22 train, 4 val, 4 test images" in (run / "train.log").read_text()
    (config,) = (log_dir / "storage").glob("*/config.yaml")
    assert "num_classes: 3" in config.read_text()
    assert json.loads((run / "summary.json").read_text())["micro_batch_size"] == 4


def test_train_and_val_folders_are_used_as_the_splits(tmp_path):
    from litlab.data.image_folder import ImageFolderDataModule

    write_image_folder(tmp_path / "train", classes=2, per_class=6, size=10)
    write_image_folder(tmp_path / "val", classes=2, per_class=3, size=10)
    data = ImageFolderDataModule("folders", [1, 6, 6], 2, str(tmp_path), batch_size=4, num_workers=0)
    data.setup("fit")
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [12, 6, 6]  # test falls back to val
    images, labels = next(iter(data.train_dataloader()))
    assert tuple(images.shape) == (4, 1, 6, 6) and labels.dtype.is_floating_point is False

    wrong = ImageFolderDataModule("folders", [1, 6, 6], 5, str(tmp_path), num_workers=0)
    with pytest.raises(ValueError, match="data.num_classes=5 but data.root=.* has 2 class folders"):
        wrong.setup("fit")
