"""The image-folder datamodule (the vision example): its splits, and what it refuses."""

from __future__ import annotations

import re

import pytest

from project.vision.image_folder import ImageFolderDataModule
from tests.conftest import TINY, logged, train_in_process
from tests.image_files import write_image_folder


def test_train_and_val_folders_are_used_as_the_splits(tmp_path):
    write_image_folder(tmp_path / "train", classes=2, per_class=6, size=10)
    write_image_folder(tmp_path / "val", classes=2, per_class=3, size=10)
    data = ImageFolderDataModule(str(tmp_path), image_shape=[1, 6, 6], batch_size=4, num_workers=0)
    assert (data.num_classes, data.classes) == (2, ["class_0", "class_1"])
    data.setup("fit")
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [12, 6, 6]  # test falls back to val
    images, labels = next(iter(data.train_dataloader()))
    assert tuple(images.shape) == (4, 1, 6, 6) and labels.dtype.is_floating_point is False


@pytest.mark.parametrize(
    "layout,words",
    [
        ("missing", "is not a folder"),
        ("no images", "holds no images"),
        ("bad shape", "data.image_shape=[4, 6, 6]"),
    ],
)
def test_a_wrong_folder_or_shape_fails_in_the_constructor_in_one_sentence(tmp_path, layout, words):
    root = tmp_path / "images"
    if layout == "no images":
        (root / "class_a").mkdir(parents=True)
        (root / "class_a" / "notes.txt").write_text("no images\n")
    elif layout == "bad shape":
        write_image_folder(root, classes=2, per_class=2, size=6)
    shape = [4, 6, 6] if layout == "bad shape" else [3, 6, 6]
    with pytest.raises(ValueError, match=re.escape(words)):
        ImageFolderDataModule(str(root), image_shape=shape)


def test_image_folder_trains_on_png_files_and_counts_its_classes(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=10, size=8)
    args = ["data=image_folder", f"data.root={root}", "data.image_shape=[3,8,8]", "data.batch_size=4"]
    outcome = train_in_process(tmp_path, *args, *TINY)
    assert outcome["status"] == "completed" and outcome["groups"]["data"] == "image_folder"
    assert "test/acc" in outcome["metrics"] and outcome["micro_batch_size"] == 4
    # 30 images: 15% test, 15% val, the rest train; 3 class folders are 3 classes.
    assert logged(tmp_path / "run", "data image_folder: 22 train, 4 val, 4 test images")
    assert logged(tmp_path / "run", ", 3 classes,")
    assert outcome["resume_exact"] is True  # the train loader is the engine's ResumableDataLoader
