"""Bench-only: when this process finished importing ``lightning`` (a Unix time) and its command
line, as JSON in ``$LITLAB_BENCH_LIGHTNING_IMPORTED.<pid>`` (nothing without that variable).

``litlab-bench`` puts this folder on the PYTHONPATH of the sweep it times, so every job's process
records its own import (Python imports ``sitecustomize`` at start-up): a job's own-process cost is
then its first optimizer step minus its own ``import lightning``, measured in the same process under
the same load, not against another process's import.
"""

import builtins
import json
import os
import sys
import time

_path = os.environ.get("LITLAB_BENCH_LIGHTNING_IMPORTED")
if _path:
    _import = builtins.__import__

    def _watching_import(*args, **kwargs):
        module = _import(*args, **kwargs)
        lightning = sys.modules.get("lightning")
        # In sys.modules from the start of its import; done once its spec stops "initializing".
        if lightning is not None and not getattr(lightning.__spec__, "_initializing", False):
            builtins.__import__ = _import
            with open(f"{_path}.{os.getpid()}", "w") as file:
                json.dump({"imported_unix": time.time(), "argv": sys.argv}, file)
        return module

    builtins.__import__ = _watching_import
