"""Known noise of the libraries a run uses, dropped exactly (``drop_known_noise``): each filter names one
message (a deprecation, Lightning's tips and checkpoint notes), so every other warning still shows.
"""

from __future__ import annotations

import logging
import warnings

# (message regex, category, module regex) for warnings.filterwarnings.
_KNOWN_WARNINGS = [
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        r"lightning\.pytorch\.utilities\._pytree",
    ),
    (r"The ``noload`` loader strategy is deprecated", DeprecationWarning, r"mlflow\.store\.tracking"),
    # eval and predict leave the checkpoint's callbacks out by design; a resumed run has them.
    (r"Be aware that when using `ckpt_path`, callbacks", UserWarning, r"lightning\.pytorch\.trainer\.call"),
    # a resumed run's own checkpoint folder
    (r"Checkpoint directory .* exists and is not empty\.", UserWarning, r"lightning\.pytorch\.callbacks"),
]
# logger -> the starts of the messages dropped from it.
_KNOWN_LOG_LINES = {
    "lightning.pytorch.utilities.rank_zero": (
        "💡 Tip: For seamless cloud logging",
        "💡 Tip: For seamless cloud uploads",
    ),
    "gcsfs": ("gcsfs experimental features enabled via GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",),
}


def _unknown(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_KNOWN_LOG_LINES.get(record.name, ()))


def drop_known_noise() -> None:
    """Install the filters (idempotent: ``addFilter`` never adds the same filter twice)."""
    for message, category, module in _KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in _KNOWN_LOG_LINES:
        logging.getLogger(name).addFilter(_unknown)
