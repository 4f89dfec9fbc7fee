"""A non-finite (nan/inf) training loss or gradient: stop the run naming the step, or skip that optimizer
step, before it reaches the weights. Lightning has no such callback since ``terminate_on_nan`` was removed.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.errors import EXIT_FAILED, LitlabError
from litlab.library_internals import foreach_copy_, foreach_norm
from litlab.storage.checkpoints import newest_checkpoint

log = logging.getLogger("litlab")


def sum_over_ranks(trainer: L.Trainer, values: list[int]) -> list[int]:
    """Each value summed over the ranks, on every rank's host (every rank must act alike). Not
    ``strategy.reduce``: it puts a barrier, one more collective, before its all-reduce."""
    sums = torch.tensor(values, device=trainer.strategy.root_device)
    torch.distributed.all_reduce(sums)
    return sums.tolist()


class NonFiniteLoss(LitlabError):
    """Training stopped because of a nan/inf loss or gradient (``on_nonfinite=fail``)."""

    exit_code = EXIT_FAILED


class NonFiniteLossGuard(Callback):
    """``action="fail"`` raises NonFiniteLoss, the last checkpoint being the last good one; ``"skip"``
    drops the optimizer step (gradients set to None, which torch optimizers skip) and counts it. Either
    way batch-norm statistics are put back. Under DDP every rank takes the same decision (one all-reduce
    per optimizer step), so no rank waits forever for one that stopped. With fp16's gradient scaler, inf
    gradients are the scaler's business (it skips those steps itself): only the loss is checked.

    ``rider``: what else the ranks agree on at each optimizer step, summed in the same all-reduce (its
    ``flags()`` before, its ``agreed(sums)`` after): the run's stop flags (``RankWatch``), so a step
    carries one collective, not two (docs/performance.md).
    """

    def __init__(self, action: str = "fail", rider: Any = None) -> None:
        self.action, self.rider = action, rider
        self.report: dict[str, Any] = {"action": action, "skipped_steps": 0, "skipped_at_steps": []}
        self._losses: list[torch.Tensor] = []  # this optimizer step's micro-batch losses
        self._buffers: list[torch.Tensor] = []  # the module's floating-point buffers (batch norm)
        self._saved: list[torch.Tensor] = []  # their values before this optimizer step
        self._batch_idx = 0

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        # Listed once, on their final device: walking the module every step costs more than the copy.
        self._buffers = [b for b in pl_module.buffers() if b.is_floating_point()]
        self._saved = [b.detach().clone() for b in self._buffers]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self._batch_idx = batch_idx
        if not self._losses and self._buffers:  # the first micro-batch of an optimizer step
            with torch.no_grad():  # one fused copy into the same tensors: cheaper than a clone
                foreach_copy_(self._saved, self._buffers)

    def on_before_backward(self, trainer: L.Trainer, pl_module, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())  # checked once per optimizer step

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module, optimizer) -> None:
        losses = torch.stack(self._losses).float() if self._losses else None  # one value per micro-batch
        self._losses = []
        problem = self._problem(trainer, optimizer, losses)
        if not self._agreed(trainer, problem is not None):
            return
        problem = problem or "loss or gradient of another rank is not finite"
        if self._buffers:  # undo what the bad step's forward passes did to batch-norm statistics
            with torch.no_grad():
                foreach_copy_(self._buffers, self._saved)
        step = trainer.global_step
        where = f"global step {step} (epoch {trainer.current_epoch}, batch {self._batch_idx})"
        if self.action == "skip":
            optimizer.zero_grad(set_to_none=True)
            self.report["skipped_steps"] = skipped = self.report["skipped_steps"] + 1
            if len(self.report["skipped_at_steps"]) < 100:
                self.report["skipped_at_steps"].append(step)
            if trainer.is_global_zero:
                log.warning("at %s the %s: optimizer step skipped (%d so far)", where, problem, skipped)
            return
        self.report["failed_at_step"] = step
        newest = newest_checkpoint(trainer)
        kept = f"the last checkpoint, {newest[0]}, is kept" if newest else "no checkpoint was written yet"
        raise NonFiniteLoss(
            f"at {where} the {problem}, so training stopped before that optimizer step and "
            f"{kept}: {_cures(trainer)}"
        )

    def _agreed(self, trainer: L.Trainer, problem: bool) -> bool:
        """Whether any rank has a problem, as every rank learns it (with the rider's sums)."""
        if trainer.world_size == 1:
            return problem
        flags = [int(problem), *(self.rider.flags() if self.rider is not None else ())]
        problems, *rider_sums = sum_over_ranks(trainer, flags)
        if self.rider is not None:
            self.rider.agreed(rider_sums)
        return problems > 0

    def _problem(self, trainer: L.Trainer, optimizer, losses: torch.Tensor | None) -> str | None:
        """What is not finite in this step on this rank, in words; None when all is well."""
        checked = [] if losses is None else [losses]
        norms = None
        if getattr(trainer.precision_plugin, "scaler", None) is None:
            grads = [
                p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
            ]
            if grads:
                # One fused kernel for all gradients, as clip_grad_norm_ uses inside (docs/performance.md).
                norms = torch.stack(foreach_norm(grads, 2, dtype=torch.float32))
                checked.append(norms)
        if not checked or bool(torch.cat(checked).isfinite().all()):  # this rank's look, on the host
            return None
        if losses is not None and not bool(losses.isfinite().all()):
            return f"loss is {losses[~torch.isfinite(losses)][0].item()}"
        norm = torch.linalg.vector_norm(norms)
        loss = f" while the loss ({losses.sum().item():.3g}) is finite" if losses is not None else ""
        return f"gradient norm is {norm.item()}{loss}"


def _cures(trainer: L.Trainer) -> str:
    cures = "lower optimizer.lr, set trainer.gradient_clip_val (e.g. 1.0), or use on_nonfinite=skip"
    if str(trainer.precision) == "16-true":  # float16 weights and optimizer state: Adam's eps=1e-8 is 0
        return (
            "precision=fp16_true keeps weights and optimizer state in float16: use precision=bf16_true "
            f"or fp16 (mixed); or {cures}"
        )
    return cures
