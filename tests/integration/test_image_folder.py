"""data=image_folder: a folder of PNG files per class trains like any other dataset."""

from __future__ import annotations

import json

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
    # 30 images: 15% test, 15% val, the rest train; 3 class folders are 3 classes.
    assert "data image_folder: 22 train, 4 val, 4 test images" in (run / "train.log").read_text()
    assert ", 3 classes," in (run / "train.log").read_text()
    assert json.loads((run / "summary.json").read_text())["micro_batch_size"] == 4
    assert outcome["resume_exact"] is True  # the train loader is the engine's ResumableDataLoader
