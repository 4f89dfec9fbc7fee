"""When Python's cyclic garbage collector may walk the objects torch and Lightning create on import.

They are many and long-lived, and a full collection walks all of them, during training and at
shutdown (docs/performance.md): they are frozen instead. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def existing_objects_frozen() -> Iterator[None]:
    """Hides what exists now from the collector while the block runs (training: one full
    collection in 600 steps of a small model cost a tenth of its training time, and under DDP the other
    ranks wait for it in the next all-reduce). Unfrozen afterwards, so that what runs after the fit
    in the same process (the test, a second fit in a notebook) can collect the fit's garbage."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def skip_collection_at_exit() -> None:
    """Called last by a console script: the exit then skips collecting everything (docs/performance.md)."""
    gc.freeze()
