"""Progress output: Lightning's rich progress bar on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import logging
import sys

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

log = logging.getLogger("litlab.progress")


def progress_bar(every_n_steps: int = 0) -> ProgressBar:
    """A RichProgressBar when stdout is a terminal; otherwise PlainProgress (CI logs stay readable)."""
    if sys.stdout.isatty():
        return RichProgressBar()
    return PlainProgress(every_n_steps)


def scalar_metrics(metrics: dict) -> dict[str, float]:
    """The one-value metrics of ``trainer.callback_metrics`` as floats."""
    return {
        name: float(value) for name, value in metrics.items() if getattr(value, "numel", lambda: 1)() == 1
    }


class PlainProgress(ProgressBar):
    """One log line per epoch (and optionally every N steps) with the progress-bar metrics."""

    def __init__(self, every_n_steps: int = 0) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self._enabled = True

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def _line(self, trainer: L.Trainer, prefix: str) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        metrics = {**trainer.progress_bar_metrics, **scalar_metrics(trainer.callback_metrics)}
        shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if "/" in k)
        log.info("%s %s", prefix, shown)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if (
            self.every_n_steps
            and step
            and step % self.every_n_steps == 0
            and ((batch_idx + 1) % trainer.accumulate_grad_batches == 0)
        ):
            self._line(trainer, f"epoch {trainer.current_epoch} step {step}:")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else "?"
        self._line(trainer, f"epoch {trainer.current_epoch + 1}/{epochs} step {trainer.global_step}:")

    def on_test_end(self, trainer, pl_module) -> None:
        self._line(trainer, "test:")
