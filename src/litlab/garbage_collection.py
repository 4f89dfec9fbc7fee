"""The objects torch and Lightning create on import are many and long-lived: frozen, so that Python's
cyclic garbage collector does not walk them during training and at exit (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def existing_objects_frozen() -> Iterator[None]:
    """Hides what exists now from the collector while the block (training) runs; under DDP the other
    ranks would wait for a full collection in the next all-reduce. Unfrozen afterwards, so that what
    runs after the fit in the same process (the test, a notebook's next fit) collects its garbage."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def skip_collection_at_exit() -> None:
    """Called last by a console script: the exit then skips collecting everything (docs/performance.md)."""
    gc.freeze()
