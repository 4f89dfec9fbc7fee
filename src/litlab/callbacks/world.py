"""The run had the ranks it was configured with, or it fails: litlab exists to compare settings, so
a run with fewer ranks than ``devices x num_nodes`` (a leftover process group, a launcher that started
fewer) must not pass for one with that many. Every rank checks, so that all fail together.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.errors import EXIT_FAILED, LitlabError


class _WorldMismatch(LitlabError):
    exit_code = EXIT_FAILED


class WorldCheck(Callback):
    """Compares ``trainer.world_size`` with the process group's size at the start of fit, and every
    rank's optimizer steps at its end; a difference fails the run in one line. ``report`` goes into
    summary.json as ``world``."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A process group of another size is known before the first step: fail now, not after training.
        members = process_group_size()
        if members != trainer.world_size:
            self._check(trainer, members, [trainer.global_step])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        members = process_group_size()
        steps = torch.tensor([trainer.global_step], device=trainer.strategy.root_device)
        if members > 1:
            steps = trainer.strategy.all_gather(steps)  # every member takes part, so none waits
        self._check(trainer, members, [int(s) for s in steps.reshape(-1).tolist()])

    def _check(self, trainer: L.Trainer, members: int, steps_per_rank: list[int]) -> None:
        expected = trainer.world_size
        self.report.update(
            configured_world_size=expected,
            process_group_size=members,
            optimizer_steps_per_rank=steps_per_rank,
        )
        if members != expected:
            raise _WorldMismatch(
                f"the run did not happen as configured: trainer.world_size is {expected} (devices x nodes) "
                f"but its process group had {members} member{'s' if members != 1 else ''}"
            )
        if len(set(steps_per_rank)) > 1:
            counts = ", ".join(f"rank {rank}: {steps}" for rank, steps in enumerate(steps_per_rank))
            raise _WorldMismatch(
                "the run did not happen as configured: its ranks took different numbers of optimizer "
                f"steps ({counts})"
            )


def process_group_size() -> int:
    """How many ranks this process trains with: its process group's members (1 without one)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1
