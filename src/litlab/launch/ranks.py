"""Who started this process's ranks.

Lightning detects torchrun and Slurm by itself; this covers what it does not:
``adopt_submitit_local_ranks`` exports the ``env://`` variables Lightning reads for the tasks of
submitit's local executor. Nothing here imports torch at module level.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

# The environment as this process started, before any sweep job ran in it: a job with DDP leaves
# LOCAL_RANK, MASTER_ADDR, WORLD_SIZE... behind (Lightning sets them and never removes them), so
# questions about who started this process's ranks are answered from this copy.
PROCESS_START_ENV: dict[str, str] = dict(os.environ)


def cluster_started_ranks(env: Mapping[str, str] | None = None) -> bool:
    """Whether a cluster launcher started this process as one rank of a job: torchrun, Slurm's
    srun, LSF's jsrun, a LOCAL_RANK set by hand, or submitit's local tasks (the variables Lightning's
    cluster environments detect). Decided from the environment the process started with: what a fit
    earlier in the same process (a notebook, an in-process test) left in ``os.environ`` must not
    count. Read here, not through Lightning, because importing Lightning is slow (docs/performance.md)
    in a process that may only wait for a child.
    """
    env = PROCESS_START_ENV if env is None else env
    if "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env:
        return True
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return True
    if int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:  # submitit's local executor: one task per rank
        return True
    return {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK"} <= env.keys()


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
