"""Resumable loaders for your datamodules: ``TensorBatches`` (data in memory as tensors) and
``ResumableDataLoader`` (any map-style Dataset, with workers). Both take ``(data, batch_size,
shuffle=, seed=)``, shard across ranks by themselves, as ``DistributedSampler`` does, and train whole
global batches only (``WholeGlobalBatches``, a callback of every litlab run).
"""

from litlab.data.resumable_loader import ResumableDataLoader
from litlab.data.tensor_batches import TensorBatches, WholeGlobalBatches

__all__ = ["ResumableDataLoader", "TensorBatches", "WholeGlobalBatches"]
