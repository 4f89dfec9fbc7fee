"""Known noise of the libraries a run uses, dropped exactly (``drop_known_noise``): each filter names one
message, so every other warning and log line still shows.

``LIGHTNING_TIPS``: Lightning's advertising tips, logged on every run. ``KNOWN_WARNINGS``: torch's
deprecation of ``LeafSpec`` (Lightning's pytree helper), SQLAlchemy's of ``noload`` (MLflow's store).
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
]
LIGHTNING_TIPS = ("💡 Tip: For seamless cloud logging", "💡 Tip: For seamless cloud uploads")
_TIP_LOGGER = "lightning.pytorch.utilities.rank_zero"  # where rank_zero_info logs them


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_TIPS)


def drop_known_noise() -> None:
    """Install the filters (idempotent: the same filter is never added twice)."""
    for message, category, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    tips = logging.getLogger(_TIP_LOGGER)
    if not any(isinstance(f, _DropLightningTips) for f in tips.filters):
        tips.addFilter(_DropLightningTips())
