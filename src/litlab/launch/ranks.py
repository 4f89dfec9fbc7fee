"""Ranks that Lightning would not adopt by itself (it detects torchrun and Slurm):
``adopt_submitit_local_ranks`` exports the ``env://`` variables Lightning reads for the tasks of
submitit's local executor. Nothing here imports torch at module level.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def adopt_submitit_local_ranks() -> None:
    """Make the tasks of a multi-task submitit local job ranks Lightning adopts, as under Slurm.

    submitit's local executor starts ``tasks_per_node`` processes but tells them their place only in
    ``SUBMITIT_LOCAL_*`` variables, which Lightning does not read; without this each task would
    train alone. submitit's own helper exports RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT
    (a port derived from the job id, the same in every task); with LOCAL_RANK set, Lightning's
    environment treats the processes as created externally and launches none.
    """
    if int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) <= 1 or "LOCAL_RANK" in os.environ:
        return
    from submitit.helpers import TorchDistributedEnvironment

    # Each task keeps every GPU visible: Lightning picks the one of its local rank.
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
