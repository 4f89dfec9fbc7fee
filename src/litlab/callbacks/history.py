"""``TrainingHistory``: a per-epoch record of a run for summary.json, learning curves that travel with it.

Each epoch: its step, training wall-clock seconds and samples so far, mean training loss, loss spikes
(``count_spikes``) and logged metrics. ``litlab-compare`` and ``litlab.run.doctor`` read it; it is part
of every checkpoint, so a resumed run continues it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.callbacks.run_stats import batch_samples

# A step's loss is a spike when it is more than twice the median of the steps before it and gives
# back at least half of what the run had gained since its first steps.
SPIKE_WINDOW = 20
SPIKE_RATIO = 2.0
SPIKE_GIVEN_BACK = 0.5
FIRST_STEPS = 5  # the run's starting loss: the mean of its first micro-batches
MAX_METRICS = 8  # logged metrics kept per epoch


def count_spikes(losses: list[float], recent: list[float], start_loss: float | None) -> int:
    """Loss spikes in ``losses`` (in order), each judged against the ``SPIKE_WINDOW`` losses before it
    (``recent`` holds those of earlier epochs and is updated in place)."""
    spikes = 0
    for loss in losses:
        if len(recent) >= SPIKE_WINDOW:
            typical = statistics.median(recent)
            gained = (start_loss - typical) if start_loss is not None else 0.0
            threshold = max(SPIKE_RATIO * typical, typical + SPIKE_GIVEN_BACK * gained)
            if loss > threshold:
                spikes += 1
        recent.append(loss)
        del recent[:-SPIKE_WINDOW]
    return spikes


class TrainingHistory(Callback):
    """Collects summary.json's ``history`` (see the module docstring); ``monitor`` is
    ``optimized_metric``, recorded only for epochs that ran validation."""

    def __init__(self, monitor: str | None = None) -> None:
        self.monitor = monitor
        self.history: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None  # this epoch's entry, until its metrics are logged
        self._losses: list[torch.Tensor] = []  # this epoch's micro-batch losses, left on the device
        self._recent: list[float] = []  # the last SPIKE_WINDOW losses, across epochs
        self._start_loss: float | None = None
        self._samples = 0
        self._earlier_seconds = 0.0  # training time of the attempts before a resume
        self._started: float | None = None
        self._validated = False
        self._trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._complete_pending()
        self._validated = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += batch_samples(pl_module, batch) * trainer.world_size
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            # No .item(), no arithmetic: either would wait for the GPU or launch a kernel every step.
            self._losses.append(loss.detach().reshape(()))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning divides the loss it hands over by the accumulation.
        scale = trainer.accumulate_grad_batches
        losses = torch.stack(self._losses).float() * scale if self._losses else torch.zeros(0)
        self._losses = []
        finite = losses[torch.isfinite(losses)]
        sums = torch.stack([finite.sum(), finite.new_tensor(float(finite.numel()))])
        loss_sum, count = trainer.strategy.reduce(sums.to(trainer.strategy.root_device), reduce_op="sum")
        local = [float(v) for v in finite.cpu()]  # one copy from the device an epoch
        if self._start_loss is None and local:
            self._start_loss = statistics.fmean(local[:FIRST_STEPS])
        spikes = count_spikes(local, self._recent, self._start_loss)
        entry: dict[str, Any] = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "wall_s": round(self._seconds(), 3),
            "samples": self._samples,
            "train_loss": float(loss_sum / count) if count else None,
            "loss_spikes": spikes,
        }
        if not self.history:
            entry["train_loss_start"] = self._start_loss  # the doctor's "still where it started"
        # Metrics that the module logs in its own on_train_epoch_end arrive after this hook (Lightning
        # calls callbacks first): the entry is completed at the next epoch, the end, or a checkpoint.
        self._pending = entry

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._complete_pending()

    def _seconds(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self._earlier_seconds + running

    def _complete_pending(self) -> None:
        if self._pending is None or self._trainer is None:
            return
        entry, self._pending = self._pending, None
        if self._validated:  # otherwise the validation metrics are an earlier epoch's
            entry["metrics"] = self._logged_metrics(self._trainer)
        self.history.append(entry)

    def _logged_metrics(self, trainer: L.Trainer) -> dict[str, float]:
        scalars = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if isinstance(value, torch.Tensor) and value.numel() == 1 and not name.endswith("_step")
        }
        names = sorted(scalars, key=lambda name: (name != self.monitor, name))[:MAX_METRICS]
        return {name: scalars[name] for name in names}

    def state_dict(self) -> dict[str, Any]:
        # Lightning asks for this while writing a checkpoint, after the module's epoch-end logging.
        self._complete_pending()
        return {
            "history": list(self.history),
            "samples": self._samples,
            "seconds": self._seconds(),
            "start_loss": self._start_loss,
            "recent": list(self._recent),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._trainer is not None and self._trainer.state.fn != "fit":
            return  # trainer.test(ckpt_path=best) restores callbacks too: keep the whole run's history
        self.history[:] = state_dict.get("history", [])  # in place: summary.json holds this list
        self._samples = int(state_dict.get("samples", 0))
        self._earlier_seconds = float(state_dict.get("seconds", 0.0))
        self._start_loss = state_dict.get("start_loss")
        self._recent = list(state_dict.get("recent", []))
