"""Text as characters: a fixed ASCII vocabulary, and a datamodule of fixed-length token sequences.

The corpus is CPython's own documentation of its keywords and statements (``pydoc_data.topics``,
about 465 KB of English that ships with every Python, so nothing is downloaded; its text changes a
little between Python versions), or any UTF-8 text file (``data.text_file``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from torch import Tensor

from litlab.data import TensorBatches
from project.splits import seeded_splits

log = logging.getLogger(__name__)

# The vocabulary is ASCII, fixed whatever the text: a checkpoint's embedding fits every corpus, and
# no vocabulary file has to travel with it. pydoc_data.topics is 99.9% ASCII (typographic quotes
# and dashes are the rest); every other character becomes ASCII's SUB ("substitute") control code.
VOCAB_SIZE = 128
SUBSTITUTE = 0x1A


def encode(text: str) -> Tensor:
    """Token ids (int64) of ``text``: code points below 128 as they are, others SUBSTITUTE."""
    codes = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)
    return torch.where(codes < VOCAB_SIZE, codes, SUBSTITUTE).long()


def decode(tokens: Tensor) -> str:
    """The text of token ids: ``decode(encode(text)) == text`` for ASCII text."""
    return "".join(map(chr, tokens.tolist()))


def pydoc_topics() -> str:
    """CPython's pydoc topics (help("if"), help("with"), ...), joined in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


class CharCorpus(L.LightningDataModule):
    """Non-overlapping sequences of ``block_size + 1`` characters (a model reads the first
    ``block_size`` and predicts each next one), split into train/val/test at random by
    ``split_seed``: the same split on every run, and no character in two splits.

    Held in memory as one int64 tensor per split, on the training device, served by the engine's
    ``TensorBatches`` (exact resume; sharded across ranks). Batches are ``(sequences,)``.
    """

    vocab_size = VOCAB_SIZE

    def __init__(
        self,
        batch_size: int = 32,
        block_size: int = 64,
        text_file: str | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        split_seed: int = 0,
    ) -> None:
        super().__init__()
        if block_size < 1:
            raise ValueError(f"data.block_size={block_size} is not allowed: use 1 or more characters")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must each be at "
                "least 0, and together below 1"
            )
        if text_file is not None and not Path(text_file).is_file():
            raise ValueError(f"data.text_file={text_file} is not a file: give a UTF-8 text file, or null")
        self.batch_size = batch_size  # the batch-size finder (tune.batch_size) sets this attribute
        self.block_size, self.text_file = block_size, text_file
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.splits: dict[str, Tensor] = {}

    def read_text(self) -> str:
        """The corpus: ``text_file`` if given, else CPython's pydoc topics."""
        return Path(self.text_file).read_text(encoding="utf-8") if self.text_file else pydoc_topics()

    def setup(self, stage: str | None = None) -> None:
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        if self.splits:
            return
        tokens = encode(self.read_text())
        length = self.block_size + 1
        count = len(tokens) // length
        sequences = tokens[: count * length].view(count, length)
        parts = seeded_splits(count, self.val_fraction, self.test_fraction, self.split_seed)
        wanted = {"train": 1.0, "val": self.val_fraction, "test": self.test_fraction}
        empty = [split for split, fraction in wanted.items() if fraction > 0 and not len(parts[split])]
        if empty:
            raise ValueError(
                f"data.block_size={self.block_size} cuts the {len(tokens)} characters into {count} "
                f"sequences: too few for a {' and a '.join(empty)} split; use a shorter block_size"
            )
        # On the training device once: otherwise every batch is copied from host memory every step.
        self.splits = {split: sequences[index].to(device) for split, index in parts.items()}
        log.info(
            "data %s: %d train, %d val, %d test sequences of %d characters, on %s",
            type(self).__name__,
            *(len(parts[split]) for split in ("train", "val", "test")),
            length,
            device,
        )

    def _loader(self, split: str, shuffle: bool) -> TensorBatches:
        return TensorBatches((self.splits[split],), self.batch_size, shuffle=shuffle, seed=self.split_seed)

    def train_dataloader(self) -> TensorBatches:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> TensorBatches:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> TensorBatches:
        return self._loader("test", shuffle=False)
