"""Ranks that Lightning would not adopt by itself (it detects torchrun and Slurm): the tasks of
submitit's local executor."""

from __future__ import annotations

import os


def adopt_submitit_local_ranks() -> None:
    """Make the tasks of a multi-task submitit local job ranks Lightning adopts, as under Slurm: they
    learn their place only from ``SUBMITIT_LOCAL_*``, which Lightning does not read (each would train
    alone). submitit's helper exports RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT; with
    LOCAL_RANK set, Lightning treats the processes as created externally and launches none."""
    if int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) <= 1 or "LOCAL_RANK" in os.environ:
        return
    from submitit.helpers import TorchDistributedEnvironment

    # Each task keeps every GPU visible: Lightning picks the one of its local rank.
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
