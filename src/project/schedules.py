"""Learning-rate schedules from torch's own schedulers, with an optional linear warm-up.

configs/scheduler/*.yaml are partials of these: each takes the optimizer and the total number of
optimizer steps and returns a scheduler config or None. ``optimizers`` builds what the example
modules' ``configure_optimizers`` return.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from hydra.utils import instantiate
from torch.optim import Optimizer
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    ExponentialLR,
    LinearLR,
    LRScheduler,
    OneCycleLR,
    SequentialLR,
)


def optimizers(
    module: L.LightningModule, optimizer_config: dict[str, Any], scheduler_config: dict[str, Any] | None
) -> Any:
    """The optimizer over the module's parameters, with its schedule if there is one (stepped every
    optimizer step, unless the schedule says otherwise). Both configs are partials (``_partial_:
    true``): the optimizer is called with the parameters, the schedule with the optimizer."""
    optimizer = instantiate(optimizer_config)(module.parameters())
    schedule = None
    if scheduler_config is not None:
        make_schedule = instantiate(scheduler_config)
        schedule = make_schedule(optimizer, total_steps=module.trainer.estimated_stepping_batches)
    if schedule is None:
        return optimizer
    if not isinstance(schedule, dict):
        schedule = {"scheduler": schedule, "interval": "step"}
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def constant(optimizer: Optimizer, total_steps: int) -> None:
    """No schedule: the learning rate stays what the optimizer says."""
    return None


def _with_warmup(optimizer: Optimizer, warmup_steps: int, main: LRScheduler) -> LRScheduler:
    if warmup_steps <= 0:
        return main
    warmup = LinearLR(optimizer, start_factor=1.0 / (warmup_steps + 1), total_iters=warmup_steps)
    return SequentialLR(optimizer, [warmup, main], milestones=[warmup_steps])


def cosine(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0
) -> LRScheduler:
    base_lr = optimizer.param_groups[0]["lr"]
    decay_steps = max(1, total_steps - warmup_steps)
    main = CosineAnnealingLR(optimizer, T_max=decay_steps, eta_min=base_lr * min_lr_ratio)
    return _with_warmup(optimizer, warmup_steps, main)


def exponential(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 0, gamma: float = 0.9
) -> dict[str, Any]:
    """Multiply the learning rate by gamma after every epoch (after warm-up steps)."""
    return {
        "scheduler": _with_warmup(optimizer, warmup_steps, ExponentialLR(optimizer, gamma=gamma)),
        "interval": "epoch",
    }


def onecycle(
    optimizer: Optimizer, total_steps: int, max_lr_factor: float = 10.0, pct_start: float = 0.3
) -> LRScheduler:
    max_lr = [group["lr"] * max_lr_factor for group in optimizer.param_groups]
    return OneCycleLR(optimizer, max_lr=max_lr, total_steps=max(2, total_steps), pct_start=pct_start)
