"""Learning-rate schedules built from torch's own schedulers, with an optional linear warm-up.

Each takes the optimizer and the run's total number of optimizer steps (computed by litlab.build from
the data size, batch sizes and epochs, so that nothing touches ``trainer.estimated_stepping_batches``,
which would set up the dataloaders before a resumed run restores their position).
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    ExponentialLR,
    LinearLR,
    LRScheduler,
    OneCycleLR,
    SequentialLR,
)


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
) -> LRScheduler:
    return _with_warmup(optimizer, warmup_steps, ExponentialLR(optimizer, gamma=gamma))


def onecycle(
    optimizer: Optimizer, total_steps: int, max_lr_factor: float = 10.0, pct_start: float = 0.3
) -> LRScheduler:
    max_lr = [group["lr"] * max_lr_factor for group in optimizer.param_groups]
    return OneCycleLR(optimizer, max_lr=max_lr, total_steps=max(2, total_steps), pct_start=pct_start)
