"""Logging helpers that Hydra's job_logging config names (no torch imports here)."""

from __future__ import annotations

import logging
import os


def global_rank() -> int:
    """This process's global rank, read from what the launcher (Lightning, torchrun, Slurm) set."""
    for name in ("RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    node_rank = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))
    if node_rank == 0:
        return local_rank
    # Lightning's subprocess launcher sets LOCAL_RANK and NODE_RANK; ranks are node-major.
    return node_rank * int(os.environ.get("LOCAL_WORLD_SIZE", 1)) + local_rank


class RankFilter(logging.Filter):
    """Adds ``%(rank)s`` to every record, so train.log lines say which rank wrote them."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = global_rank()
        return True


def route_lightning_logs_to_root() -> None:
    """Send Lightning's log lines through the root logger's handlers (Hydra's console and train.log):
    ``import lightning`` before Hydra configures logging gives its loggers a console handler of their
    own and stops them from propagating, so their lines would miss train.log."""
    if not logging.getLogger().hasHandlers():
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
