"""A non-finite (nan/inf) training loss: stop the run naming the step, or skip that optimizer step.

Lightning has no such callback since ``Trainer(terminate_on_nan=...)`` was removed, and
``EarlyStopping(check_finite=True)`` looks only at a validation metric once per epoch. The check
happens before the optimizer step, so the weights that produced a finite loss are never replaced
by a nan update, and no checkpoint is written afterwards: the last checkpoint stays the last good one.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.errors import LitlabError

log = logging.getLogger("litlab")


class NonFiniteLoss(LitlabError):
    """Training stopped because of a nan/inf loss (``on_nonfinite=fail``)."""

    exit_code = 1


class NonFiniteLossGuard(Callback):
    """``action="fail"`` raises NonFiniteLoss; ``action="skip"`` drops the optimizer step (its
    gradients are set to None, which torch optimizers skip) and counts it.

    Under DDP every rank takes the same decision (one boolean all-reduce per optimizer step), so no
    rank waits forever for one that stopped.
    """

    def __init__(self, action: str = "fail") -> None:
        self.action = action
        self.report: dict[str, Any] = {"action": action, "skipped_steps": 0, "skipped_at_steps": []}
        self._losses: list[torch.Tensor] = []  # this optimizer step's micro-batch losses
        self._batch_idx = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self._batch_idx = batch_idx

    def on_before_backward(self, trainer: L.Trainer, pl_module, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())  # checked once per optimizer step: one device sync

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module, optimizer) -> None:
        losses, self._losses = self._losses, []
        values = torch.stack([loss.float().reshape(()) for loss in losses]) if losses else None
        local_bad = values is not None and not bool(torch.isfinite(values).all())
        if not trainer.strategy.reduce_boolean_decision(local_bad, all=False):
            return
        step, epoch = trainer.global_step, trainer.current_epoch
        seen = values[~torch.isfinite(values)][0].item() if local_bad else float("nan")
        where = f"global step {step} (epoch {epoch}, batch {self._batch_idx})"
        if self.action == "skip":
            optimizer.zero_grad(set_to_none=True)
            self.report["skipped_steps"] += 1
            if len(self.report["skipped_at_steps"]) < 100:
                self.report["skipped_at_steps"].append(step)
            if trainer.is_global_zero:
                log.warning(
                    "loss is %s at %s: optimizer step skipped (%d so far)",
                    seen,
                    where,
                    self.report["skipped_steps"],
                )
            return
        self.report["failed_at_step"] = step
        checkpoint = getattr(trainer.checkpoint_callback, "last_model_path", "") or None
        kept = (
            f"the last checkpoint, {checkpoint}, is kept" if checkpoint else "no checkpoint was written yet"
        )
        raise NonFiniteLoss(
            f"training loss is {seen} at {where}, so training stopped before that optimizer step and "
            f"{kept}: lower optimizer.lr, set trainer.gradient_clip_val (e.g. 1.0), or use on_nonfinite=skip"
        )
