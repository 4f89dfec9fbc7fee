"""``PredictionFiles``: litlab-predict's ``BasePredictionWriter``. Every rank keeps its batches'
predictions with their samples' indices; rank 0 gathers them and writes them in sample order to
``predictions.csv`` (a row per sample) and ``predictions.pt`` (its tensors whole): docs/contract.md.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from litlab.errors import LitlabError, first_line

log = logging.getLogger("litlab")
_ALLOWED = "return a tensor, or a dict of tensors and lists with one entry per sample (docs/contract.md)"


class PredictionFiles(BasePredictionWriter):
    """Writes the predictions of every rank, as the module docstring says (rank 0 writes)."""

    def __init__(self, folder: Path, split: str) -> None:
        super().__init__(write_interval="batch")
        self.folder, self.split = folder, split
        self.index: list[int] = []
        self.loader: list[int] = []  # the dataloader_idx of each sample
        self.seen: dict[int, int] = {}  # samples of each dataloader so far
        self.values: dict[str, list] = {}  # name: the batches' tensors (on the CPU) or lists

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        owner = type(pl_module).__name__
        columns = _columns(prediction, owner)
        size = len(next(iter(columns.values())))
        if self.values and columns.keys() != self.values.keys():
            raise LitlabError(
                f"{owner}.predict_step returned {sorted(columns)} for batch {batch_idx} and "
                f"{sorted(self.values)} before: return the same names for every batch"
            )
        for name, value in columns.items():
            self.values.setdefault(name, []).append(value)
        seen = self.seen.get(dataloader_idx, 0)
        indices = batch_indices or _loader_indices(trainer, batch_idx, dataloader_idx)
        if indices is None:  # one rank, a loader that cannot say: the samples' positions in its order
            indices = range(seen, seen + size)
        if len(indices) != size:
            raise LitlabError(
                f"{owner}.predict_step returned {size} predictions for a batch of {len(indices)} samples: "
                f"{_ALLOWED}"
            )
        self.seen[dataloader_idx] = seen + size
        self.index.extend(indices)
        self.loader.extend([dataloader_idx] * size)

    def on_predict_end(self, trainer, pl_module) -> None:
        part = (self.index, self.loader, self.values)
        if trainer.world_size == 1:
            return self.write([part])
        parts = [None] * trainer.world_size if trainer.is_global_zero else None
        torch.distributed.gather_object(part, parts, dst=0)  # every rank's part, on rank 0
        if parts is not None:
            self.write(parts)

    def write(self, parts: list[tuple]) -> None:
        """Rank 0: every rank's part, in (dataloader, index) order, to predictions.csv and .pt."""
        index = [i for part in parts for i in part[0]]
        loader = [d for part in parts for d in part[1]]
        order = sorted(range(len(index)), key=lambda k: (loader[k], index[k]))
        rows = torch.tensor(order, dtype=torch.long)
        columns: dict[str, Any] = {"index": torch.tensor(index, dtype=torch.long)[rows]}
        if len(set(loader)) > 1:  # several predict loaders: a sample is (dataloader, index)
            columns["dataloader"] = torch.tensor(loader, dtype=torch.long)[rows]
        repeated = len(index) - len(set(zip(loader, index, strict=True)))
        if repeated:  # e.g. a DistributedSampler of your own, which pads every rank's share
            log.warning("%d samples were predicted more than once: each has a row per prediction", repeated)
        if len({frozenset(part[2]) for part in parts if part[2]}) > 1:  # a rank may have had no batch
            raise LitlabError(f"the ranks' predict_step returned different names: {_ALLOWED}")
        names = next((part[2] for part in parts if part[2]), {})
        for name in names:
            pieces = [piece for part in parts for piece in part[2][name]]
            try:
                if isinstance(pieces[0], torch.Tensor):
                    columns[name] = torch.cat(pieces)[rows]
                else:
                    values = [value for piece in pieces for value in piece]
                    columns[name] = [values[k] for k in order]
            except (RuntimeError, TypeError) as error:  # e.g. generated sequences of different lengths
                raise LitlabError(
                    f"predict_step returned {name} of different shapes or types across batches "
                    f"({type(error).__name__}: {first_line(error)}): {_ALLOWED}"
                ) from error
        written = [_write_csv(self.folder / "predictions.csv", columns)]
        tensors = {name: value for name, value in columns.items() if isinstance(value, torch.Tensor)}
        if tensors.keys() - {"index", "dataloader"}:
            torch.save(tensors, self.folder / "predictions.pt")
            written.append(self.folder / "predictions.pt")
        log.info("%d predictions of the %s split: %s", len(index), self.split, ", ".join(map(str, written)))


def _columns(prediction: Any, owner: str) -> dict[str, Any]:
    """A batch's prediction as named values with one entry per sample: a tensor is ``prediction``;
    a dict's values are tensors (first dimension: the samples) or lists."""
    if isinstance(prediction, torch.Tensor):
        prediction = {"prediction": prediction}
    if not isinstance(prediction, Mapping) or not prediction:
        raise LitlabError(f"{owner}.predict_step returned {type(prediction).__name__}: {_ALLOWED}")
    columns: dict[str, Any] = {}
    for name, value in prediction.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            columns[str(name)] = value.detach().cpu()
        elif isinstance(value, (list, tuple)):
            columns[str(name)] = list(value)
        else:
            raise LitlabError(f"{owner}.predict_step returned {name}={type(value).__name__}: {_ALLOWED}")
    sizes = {name: len(value) for name, value in columns.items()}
    if len(set(sizes.values())) != 1:
        raise LitlabError(f"{owner}.predict_step returned values of different lengths {sizes}: {_ALLOWED}")
    return columns


def _loader_indices(trainer: Any, batch_idx: int, dataloader_idx: int) -> list[int] | None:
    """The samples of a batch from a loader Lightning does not track (it tracks DataLoaders): what the
    loader says (``TensorBatches.batch_indices``); None on one rank for a loader that cannot say."""
    loaders = trainer.predict_dataloaders
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    loader = loaders[dataloader_idx] if isinstance(loaders, (list, tuple)) else loaders
    if hasattr(loader, "batch_indices"):
        return loader.batch_indices(batch_idx)
    if trainer.world_size > 1:
        raise LitlabError(
            f"the predict loader ({type(loader).__name__}) does not say which samples its batches hold, "
            f"so the predictions of {trainer.world_size} ranks cannot be put in order: return a torch "
            "DataLoader or litlab.data.TensorBatches from predict_dataloader, or predict with devices=1"
        )
    return None


def _write_csv(path: Path, columns: dict[str, Any]) -> Path:
    """A row per sample; a tensor of more than two dimensions is left to predictions.pt (one line says so)."""
    header, cells = [], []
    for name, value in columns.items():
        if not isinstance(value, torch.Tensor):
            header.append(name)
            cells.append(value)
            continue
        if value.dim() > 2:
            log.info(
                "predictions.csv leaves out %s (shape %s): it is in predictions.pt", name, list(value.shape)
            )
            continue
        if value.is_floating_point() and value.dtype != torch.float64:
            value = value.float()  # numpy has no bfloat16
        array = value.numpy()  # numpy's scalars print their shortest exact text: float32 0.1 as 0.1
        if array.ndim == 1:
            header.append(name)
            cells.append(array)
        else:
            header.extend(f"{name}_{k}" for k in range(array.shape[1]))
            cells.extend(array.T)
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(zip(*cells, strict=True))
    return path
