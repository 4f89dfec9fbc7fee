"""A small CIFAR-10 in CIFAR-10's own python format, written by the tests (nothing is downloaded).

The layout torchvision's ``CIFAR10`` reads: ``cifar-10-batches-py/`` with pickled ``data_batch_1``
to ``data_batch_5`` and ``test_batch`` (``data``: uint8 rows of 3072 values, channel-major 32x32;
``labels``) and ``batches.meta`` (``label_names``). Each image is noise around a colour of its
class, so a network can learn the labels.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar10(root: Path, images_per_batch: int = 40, seed: int = 0) -> Path:
    """Write the files under ``root`` (what ``data.root`` then names) and return ``root``."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    colours = generator.integers(0, 256, size=(10, 3))
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = generator.integers(0, 10, size=images_per_batch)
        noise = generator.normal(0, 40, size=(images_per_batch, 3, 32 * 32))
        pixels = np.clip(colours[labels][:, :, None] + noise, 0, 255).astype(np.uint8)
        batch = {"batch_label": name, "labels": labels.tolist(), "data": pixels.reshape(images_per_batch, -1)}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": LABEL_NAMES, "num_vis": 3072}))
    return root
