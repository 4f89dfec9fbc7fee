"""Resumable loaders for your datamodules: ``TensorBatches`` (data in memory as tensors) and
``ResumableDataLoader`` (any map-style Dataset, with workers). Both take ``(data, batch_size,
shuffle=, seed=)`` and shard across ranks by themselves, as ``DistributedSampler`` does.
"""

from litlab.data.resumable_loader import ResumableDataLoader
from litlab.data.tensor_batches import TensorBatches

__all__ = ["ResumableDataLoader", "TensorBatches"]
