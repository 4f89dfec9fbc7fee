"""Writes small PNG image folders for tests (torchvision.datasets.ImageFolder layout)."""

from __future__ import annotations

from pathlib import Path


def write_image_folder(root: Path, classes: int = 2, per_class: int = 12, size: int = 8) -> Path:
    """``root/class_<k>/<i>.png``: RGB squares whose colour depends on the class, so it is learnable."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(classes):
        folder = root / f"class_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
            pixels[..., k % 3] += 150
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root
