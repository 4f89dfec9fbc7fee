"""Resumable loaders the engine offers to your datamodules: exact resume for any task.

- ``TensorBatches``: datasets held in memory as tensors (index-batching on the training device);
- ``ResumableDataLoader``: any map-style Dataset, with worker processes (torchdata's StatefulDataLoader).

Both take ``(data, batch_size, shuffle=, seed=)`` and shard across ranks by themselves: the rank and
the number of ranks come from the process group, as ``DistributedSampler`` finds them.
"""

from litlab.data.resumable_loader import ResumableDataLoader
from litlab.data.tensor_batches import TensorBatches

__all__ = ["ResumableDataLoader", "TensorBatches"]
