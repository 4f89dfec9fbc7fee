"""After fit: the run had the world it was configured with, or it fails instead of reporting one.

litlab exists to compare settings, so a run with fewer ranks than ``trainer.devices x num_nodes``
(a process group left over from an earlier job, a launcher that started fewer tasks) must not be
reported as a run with that many. Every rank checks, so that all of them fail together.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.errors import EXIT_FAILED, LitlabError


class WorldMismatch(LitlabError):
    """The run did not have the ranks it was configured with, or its ranks disagree on the steps."""

    exit_code = EXIT_FAILED


def world_problem(expected: int, members: int, steps_per_rank: list[int]) -> str | None:
    """What differs between the configured world and the one that trained, in words; None if nothing."""
    if members != expected:
        return (
            f"the run did not happen as configured: trainer.world_size is {expected} (devices x nodes) "
            f"but its process group had {members} member{'s' if members != 1 else ''}"
        )
    if len(set(steps_per_rank)) > 1:
        counts = ", ".join(f"rank {rank}: {steps}" for rank, steps in enumerate(steps_per_rank))
        return (
            "the run did not happen as configured: its ranks took different numbers of optimizer "
            f"steps ({counts})"
        )
    return None


class WorldCheck(Callback):
    """At the start of fit, compares ``trainer.world_size`` with the process group's size; at its end,
    also every rank's optimizer steps; raises ``WorldMismatch`` (one line) when they differ.
    ``report`` goes into summary.json as ``world``."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A process group of another size is known before the first step: fail now, not after training.
        members = process_group_size()
        if members != trainer.world_size:
            self.report.update(
                configured_world_size=trainer.world_size,
                process_group_size=members,
                optimizer_steps_per_rank=[trainer.global_step],
            )
            raise WorldMismatch(world_problem(trainer.world_size, members, []))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        members = process_group_size()
        steps = torch.tensor([trainer.global_step], device=trainer.strategy.root_device)
        if members > 1:
            steps = trainer.strategy.all_gather(steps)  # every member takes part, so none waits
        steps_per_rank = [int(s) for s in steps.reshape(-1).tolist()]
        self.report.update(
            configured_world_size=trainer.world_size,
            process_group_size=members,
            optimizer_steps_per_rank=steps_per_rank,
        )
        problem = world_problem(trainer.world_size, members, steps_per_rank)
        if problem is not None:
            raise WorldMismatch(problem)


def process_group_size() -> int:
    """How many ranks this process trains with: its process group's members (1 without one)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1
