"""Networks that fail on purpose, for tests: picked with ``model=mlp model.net._target_=tests.faults.X``.

The test process puts the repository on PYTHONPATH so that training subprocesses can import them.
"""

from __future__ import annotations

import torch

from litlab.models.nets import MLP


class MLPOutOfMemoryAbove32(MLP):
    """An MLP that raises CUDA's out-of-memory error for batches of more than 32 samples, as a GPU
    with room for 32 would, on any device."""

    max_batch = 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_batch:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by tests.faults: batch "
                f"{x.shape[0]} > {self.max_batch})"
            )
        return super().forward(x)
