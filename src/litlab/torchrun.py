"""A torchrun group restarted by ``--max-restarts`` joins its process group in store keys of its own."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def join_restarted_torchrun_group(trainer: Any) -> None:
    """Join the process group of a restarted torchrun group in fresh store keys, before Lightning would.
    torchrun's agent keeps its store, with the crashed group's gloo addresses, across restarts: a rank
    that looks before rank 0 re-registered connects to a dead address ("Gloo connectFullMesh failed ...
    Connection refused"; plain torch fails the same way)."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 or "TORCHELASTIC_RUN_ID" not in os.environ or trainer.world_size < 2:
        return
    import datetime

    import torch.distributed as dist

    from litlab.library_internals import default_process_group_backend, process_group_timeout

    if dist.is_initialized():
        return
    strategy = trainer.strategy
    backend = getattr(strategy, "process_group_backend", None)
    backend = backend or default_process_group_backend(strategy.root_device)
    timeout = process_group_timeout(strategy) or datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    where = (restart, trainer.global_rank, trainer.world_size)
    log.info("torchrun restart %d: rank %d of %d joins the process group in fresh store keys", *where)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"litlab/restart_{restart}", store),
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        timeout=timeout,
    )
