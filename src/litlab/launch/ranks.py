"""Who started this process's ranks, and the one run directory they all share.

Lightning detects torchrun and Slurm by itself; this covers what it does not. ``with_agreed_run_dir``
gives every torchrun rank the ``hydra.run.dir`` that global rank 0 resolved (in a Slurm step the
``litlab_run_stamp`` resolver of ``litlab.config.resolvers`` derives it from the job), and
``adopt_submitit_local_ranks`` exports the ``env://`` variables Lightning reads for the tasks of
submitit's local executor. Nothing here imports torch at module level.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from litlab.logs import global_rank
from litlab.torchrun import agent_store, shares_agent_store

log = logging.getLogger(__name__)

# The environment as this process started, before any sweep job ran in it: a job with DDP leaves
# LOCAL_RANK, MASTER_ADDR, WORLD_SIZE... behind (Lightning sets them and never removes them), so
# questions about who started this process's ranks are answered from this copy.
PROCESS_START_ENV: dict[str, str] = dict(os.environ)

# The key the ranks of one torchrun job agree on, in the store torchrun's agent serves. The agent's
# store outlives worker restarts (--max-restarts), so a restarted group keeps its run directory.
_RUN_DIR_KEY = "litlab/run_dir"


def with_agreed_run_dir(config_name: str, args: list[str]) -> list[str]:
    """``args`` plus ``hydra.run.dir=<global rank 0's run directory>`` for every rank torchrun started
    (what Lightning's own launcher passes its ranks), so that all write one run directory whatever
    ``hydra.run.dir`` resolves to; ``args`` unchanged elsewhere, and for Hydra's flags (``-m``...).

    Rank 0 resolves the directory from the config, as Hydra will, and stores it in the store
    torchrun's agent serves; the other ranks wait for it there.
    """
    if not shares_agent_store():
        return args
    if any(arg.startswith("-") for arg in args):
        return args
    store = agent_store()
    if global_rank() == 0:
        # compare_set sets the key only if it is absent and returns what is stored: a restarted group
        # (the agent's store outlives its workers) finds the first start's directory.
        run_dir = store.compare_set(_RUN_DIR_KEY, "", _resolved_run_dir(config_name, args)).decode()
    else:
        run_dir = store.get(_RUN_DIR_KEY).decode()  # waits until rank 0 has stored it
    return [*args, f"hydra.run.dir={_quoted(run_dir)}"]


def _resolved_run_dir(config_name: str, args: list[str]) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from litlab.config.preflight import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=args, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # the pattern may use ${hydra:...}
    return str(cfg.hydra.run.dir)


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


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
