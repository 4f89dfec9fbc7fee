"""Known noise of the libraries a run uses, dropped exactly: each filter names one message, so
every other warning and log line still shows.

- Lightning's advertising tips (``💡 Tip: ...``: litlogger, litmodels), logged at INFO on every run;
- torch 2.14's deprecation of ``LeafSpec``, which Lightning 2.6's pytree helper still builds;
- SQLAlchemy 2.1's deprecation of ``noload``, which MLflow's local SQLite store still uses.
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
