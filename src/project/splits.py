"""Train/val/test splits of a table of examples, the same on every run and every rank."""

from __future__ import annotations

import torch
from torch import Tensor


def seeded_splits(count: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, Tensor]:
    """Disjoint index tensors ``train``, ``val``, ``test`` covering ``range(count)``, drawn from a
    generator of their own seeded with ``seed`` (never the global one: ``seed=`` of a run must not
    move examples between splits)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = int(count * test_fraction), int(count * val_fraction)
    return {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }
