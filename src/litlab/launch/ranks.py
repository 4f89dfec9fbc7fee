"""Who started this process's ranks, and the one run directory they all share.

litlab's code is the same on a laptop and on 8 nodes x 8 GPUs; what changes is who starts the ranks:
Lightning's own subprocess launcher, torchrun (TorchElastic), Slurm (``srun``, or Hydra's submitit
launcher) or submitit's local executor. Lightning detects TorchElastic and Slurm by itself and then
launches nothing. This module covers what it does not:

- every rank runs Hydra, and each would resolve ``hydra.run.dir`` itself (a timestamp, a random
  suffix, any ``${now:...}`` of the user's pattern): under torchrun ``with_agreed_run_dir`` hands
  every rank the directory global rank 0 resolved, before Hydra starts; in a Slurm step
  ``run_stamp`` derives one from the job and step ids;
- only global rank 0 writes ``.hydra/`` (``rank_zero_only``);
- submitit's local executor starts the tasks but sets only ``SUBMITIT_LOCAL_*`` variables:
  ``adopt_submitit_local_ranks`` exports the ``env://`` variables Lightning reads, so those tasks
  become ranks exactly as Slurm's do;
- launcher configs size Slurm jobs from ``trainer.devices`` / ``trainer.accelerator``.

Nothing here imports torch at module level: Hydra's resolvers call in before training starts.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from litlab.logs import global_rank

log = logging.getLogger(__name__)

# The environment as this process started, before any sweep job ran in it: a job with DDP leaves
# LOCAL_RANK, MASTER_ADDR, WORLD_SIZE... behind (Lightning sets them and never removes them), so
# questions about who started this process's ranks are answered from this copy.
PROCESS_START_ENV: dict[str, str] = dict(os.environ)

# The key the ranks of one torchrun job agree on, in the store torchrun's agent serves. The agent's
# store outlives worker restarts (--max-restarts), so a restarted group keeps its run directory.
_RUN_DIR_KEY = "litlab/run_dir"
_STORE_TIMEOUT_S = 300


def register() -> None:
    """Register the resolvers that configs/hydra/ and configs/hydra/launcher/ use (idempotent)."""
    import warnings

    from omegaconf import OmegaConf

    # configs/hydra/launcher/submitit_local.yaml takes the plugin's own name on purpose, so Hydra
    # validates it against the plugin's schema of that name, and warns that such matching is
    # deprecated. The match is what we want; the warning would print on every such multirun.
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_local' is validated against")

    resolvers = {
        "litlab_run_stamp": run_stamp,
        "litlab_rank_zero_only": rank_zero_only,
        "litlab_tasks_per_node": tasks_per_node,
        "litlab_gpus_per_node": gpus_per_node,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


@functools.cache
def run_stamp(proposal: str) -> str:
    """The last part of the run directory, the same in every rank of one launch.

    ``proposal`` (timestamp + random suffix, resolved by this process) is used as it is when this
    process is the only rank, and under torchrun (``with_agreed_run_dir`` then pins the directory of
    global rank 0 for every rank). In a Slurm step of several tasks (``srun``) every task derives it
    from the job and step ids, which also keeps a requeued job in its run directory. For launchers
    litlab does not know, give every rank the same ``hydra.run.dir``.
    """
    if _under_torchrun() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # No shared store to agree through (e.g. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): the rendezvous id is.
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        if run_id != "none":
            return f"torchrun-{run_id}"
        log.warning(
            "torchrun without an agent store or --rdzv-id: each rank may write its own run directory; "
            "give every rank the same hydra.run.dir"
        )
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:  # inside `srun` with several tasks
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    return proposal


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def with_agreed_run_dir(config_name: str, args: list[str]) -> list[str]:
    """``args`` plus ``hydra.run.dir=<global rank 0's run directory>`` for every rank torchrun started
    (what Lightning's own launcher passes its ranks), so that all write one run directory whatever
    ``hydra.run.dir`` resolves to; ``args`` unchanged elsewhere, and for Hydra's flags (``-m``...).

    Rank 0 resolves the directory from the config, as Hydra will, and stores it in the store
    torchrun's agent serves; the other ranks wait for it there.
    """
    if not _under_torchrun() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return args
    if any(arg.startswith("-") for arg in args):
        return args
    store = _agent_store()
    if global_rank() == 0:
        # compare_set sets the key only if it is absent and returns what is stored: a restarted group
        # (the agent's store outlives its workers) finds the first start's directory.
        run_dir = store.compare_set(_RUN_DIR_KEY, "", _resolved_run_dir(config_name, args)).decode()
    else:
        run_dir = store.get(_RUN_DIR_KEY).decode()  # waits until rank 0 has stored it
    return [*args, f"hydra.run.dir={_quoted(run_dir)}"]


def agreed_with_rank_zero(name: str, rank_zero_value: Callable[[], str]) -> str | None:
    """Under torchrun (with its agent's store): ``rank_zero_value()`` as global rank 0 computed it
    in this start of the group, on every rank (rank 0 stores it; the others wait for it). None
    elsewhere: the caller decides for itself.

    For what each rank must not decide alone: torchrun starts its ranks at once, each reading shared
    files that rank 0 may be changing (a restarted group once had rank 0 resume and rank 1 start
    fresh, and hung in mismatched collectives)."""
    if not _under_torchrun() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = _agent_store()
    key = f"litlab/{name}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # one per start of the group
    if global_rank() == 0:
        value = rank_zero_value()
        store.set(key, value)
        return value
    return store.get(key).decode()  # waits until rank 0 has stored it


def _agent_store():
    """A client of the store torchrun's agent serves (it outlives worker restarts)."""
    import datetime

    from torch.distributed import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
    )


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


def join_restarted_torchrun_group(trainer: Any) -> None:
    """A torchrun group restarted by ``--max-restarts`` joins its process group in store keys of its
    own, before Lightning would (Lightning then finds it joined).

    torchrun's agent keeps its store across restarts, and the crashed group's gloo addresses stay in it
    (the static and the c10d rendezvous alike): a restarted rank that looks before rank 0 has
    re-registered connects to a dead address and the restart fails, "Gloo connectFullMesh failed ...
    Connection refused" (torch 2.14; a 10-line torch script without litlab fails the same way).
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 or not _under_torchrun() or trainer.world_size < 2:
        return
    import datetime

    import torch.distributed as dist
    from lightning.fabric.utilities.distributed import _get_default_process_group_backend_for_device

    if dist.is_initialized():
        return
    strategy = trainer.strategy
    backend = getattr(strategy, "_process_group_backend", None)
    backend = backend or _get_default_process_group_backend_for_device(strategy.root_device)
    timeout = getattr(strategy, "_timeout", None) or datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    log.info(
        "torchrun restart %d: rank %d of %d joins the process group in fresh store keys",
        restart,
        trainer.global_rank,
        trainer.world_size,
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"litlab/restart_{restart}", store),
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        timeout=timeout,
    )


def cluster_started_ranks(env: Mapping[str, str] | None = None) -> bool:
    """Whether a cluster launcher started this process as one rank of a job: torchrun, Slurm's
    srun, LSF's jsrun, a LOCAL_RANK set by hand, or submitit's local tasks (the variables Lightning's
    cluster environments detect). Decided from the environment the process started with: what a fit
    earlier in the same process (a notebook, an in-process test) left in ``os.environ`` must not
    count. Read here, not through Lightning, because importing Lightning costs ~8 s in a process that
    may only wait for a child.
    """
    env = PROCESS_START_ENV if env is None else env
    if "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env:
        return True
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return True
    if int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:  # submitit's local executor: one task per rank
        return True
    return {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK"} <= env.keys()


def rank_zero_only(value: Any) -> Any:
    """``value`` on global rank 0, None elsewhere (so ``hydra.output_subdir`` is written once)."""
    return value if global_rank() == 0 else None


def tasks_per_node(devices: Any) -> int:
    """Slurm tasks per node for ``trainer.devices``: one task per device, each task one rank."""
    from litlab.config.rules import device_count

    count = device_count(devices)
    if count is None:
        raise ValueError(
            f"trainer.devices={devices} cannot size a Slurm job: set trainer.devices to the number of "
            "devices (ranks) per node"
        )
    return count


def gpus_per_node(accelerator: str, devices: Any) -> int | None:
    """GPUs to request per node: one per device when ``trainer.accelerator`` is a GPU, else None
    (ask for none: the right thing on CPU-only partitions)."""
    return tasks_per_node(devices) if str(accelerator) in ("gpu", "cuda") else None


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
