"""What the ranks of one torchrun group share: the store torchrun's agent serves, which outlives worker
restarts (``agreed_with_rank_zero``, ``join_restarted_torchrun_group``). torch is imported only when a
store is used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from litlab.logs import global_rank

log = logging.getLogger(__name__)

_STORE_TIMEOUT_S = 300


def under_torchrun() -> bool:
    """Whether torchrun started this process as one of several ranks."""
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def shares_agent_store() -> bool:
    """Whether this torchrun rank can reach the store torchrun's agent serves (not with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, for one)."""
    return under_torchrun() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def agreed_with_rank_zero(name: str, rank_zero_value: Callable[[], str]) -> str | None:
    """Under torchrun (with its agent's store): ``rank_zero_value()`` as global rank 0 computed it
    in this start of the group, on every rank (rank 0 stores it; the others wait for it). None
    elsewhere: the caller decides for itself.

    For what each rank must not decide alone: torchrun starts its ranks at once, each reading shared
    files that rank 0 may be changing (a restarted group once had rank 0 resume and rank 1 start
    fresh, and hung in mismatched collectives)."""
    if not shares_agent_store():
        return None
    store = agent_store()
    key = f"litlab/{name}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # one per start of the group
    if global_rank() == 0:
        value = rank_zero_value()
        store.set(key, value)
        return value
    return store.get(key).decode()  # waits until rank 0 has stored it


def agent_store() -> Any:  # torch.distributed.TCPStore
    """A client of the store torchrun's agent serves (it outlives worker restarts)."""
    import datetime

    from torch.distributed import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
    )


def join_restarted_torchrun_group(trainer: Any) -> None:
    """A torchrun group restarted by ``--max-restarts`` joins its process group in store keys of its
    own, before Lightning would (Lightning then finds it joined).

    torchrun's agent keeps its store across restarts, and the crashed group's gloo addresses stay in it
    (the static and the c10d rendezvous alike): a restarted rank that looks before rank 0 has
    re-registered connects to a dead address and the restart fails, "Gloo connectFullMesh failed ...
    Connection refused" (torch 2.14; a 10-line torch script without litlab fails the same way).
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 or not under_torchrun() or trainer.world_size < 2:
        return
    import datetime

    import torch.distributed as dist

    from litlab.library_internals import default_process_group_backend, process_group_timeout

    if dist.is_initialized():
        return
    strategy = trainer.strategy
    backend = getattr(strategy, "process_group_backend", None) or default_process_group_backend(
        strategy.root_device
    )
    timeout = process_group_timeout(strategy) or datetime.timedelta(minutes=30)
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
