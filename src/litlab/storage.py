"""Where a run's checkpoints, config copy and summary persist: ``<storage.root>/<run identity>/``.

Roots are fsspec URLs (a local path, ``s3://bucket/prefix``, ...), so every backend goes through
one code path. The run directory keeps the logs; for a local root it links ``checkpoints/`` to the
storage folder, for a remote one it holds a ``checkpoints.url`` pointer file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem


class RunStorage:
    """The storage folder of one run identity."""

    def __init__(self, root: str, identity: str) -> None:
        self.root = root.rstrip("/")
        self.url = f"{self.root}/{identity}"
        self.fs, self.path = fsspec.core.url_to_fs(self.url)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def checkpoint_url(self) -> str:
        return f"{self.url}/checkpoints"

    def prepare(self) -> None:
        self.fs.makedirs(f"{self.path}/checkpoints", exist_ok=True)

    def write_text(self, name: str, text: str) -> None:
        """Write ``<storage folder>/name``; locally via a temporary file and a rename (atomic)."""
        target = f"{self.path}/{name}"
        if self.is_local:
            write_text_atomic(Path(target), text)
        else:
            with self.fs.open(target, "w") as f:
                f.write(text)

    def link_into(self, run_dir: Path) -> None:
        """Make ``<run dir>/checkpoints`` lead to this run's checkpoints."""
        link = run_dir / "checkpoints"
        if link.exists() or link.is_symlink():
            return
        if self.is_local:
            link.symlink_to(Path(self.path) / "checkpoints", target_is_directory=True)
        else:
            (run_dir / "checkpoints.url").write_text(self.checkpoint_url + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_checkpoint(url: str) -> dict:
    """A checkpoint's contents, loaded safely (``weights_only=True``) from any fsspec URL."""
    import torch

    with fsspec.open(url, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)
