"""Known noise of the libraries a run uses, dropped exactly (``drop_known_noise``): each filter names one
message, so every other warning and log line still shows.

``KNOWN_WARNINGS``: torch's LeafSpec and SQLAlchemy's noload deprecations; Lightning's advice to pass a
checkpoint's callbacks (eval and predict leave them out by design; a resumed run has them, they are in
its identity) and its note that a run's own checkpoint folder is not empty (on resume).
``KNOWN_LOG_LINES``: Lightning's tips; gcsfs's experimental-features line (Lightning imports gcsfs).
"""

from __future__ import annotations

import logging
import warnings

# (message regex, category, module regex) for warnings.filterwarnings.
KNOWN_WARNINGS = [
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        r"lightning\.pytorch\.utilities\._pytree",
    ),
    (r"The ``noload`` loader strategy is deprecated", DeprecationWarning, r"mlflow\.store\.tracking"),
    (r"Be aware that when using `ckpt_path`, callbacks", UserWarning, r"lightning\.pytorch\.trainer\.call"),
    (r"Checkpoint directory .* exists and is not empty\.", UserWarning, r"lightning\.pytorch\.callbacks"),
]
# logger -> the starts of the messages dropped from it.
KNOWN_LOG_LINES = {
    "lightning.pytorch.utilities.rank_zero": (
        "💡 Tip: For seamless cloud logging",
        "💡 Tip: For seamless cloud uploads",
    ),
    "gcsfs": ("gcsfs experimental features enabled via GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",),
}


def _unknown(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(KNOWN_LOG_LINES.get(record.name, ()))


def drop_known_noise() -> None:
    """Install the filters (idempotent: ``addFilter`` never adds the same filter twice)."""
    for message, category, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in KNOWN_LOG_LINES:
        logging.getLogger(name).addFilter(_unknown)
