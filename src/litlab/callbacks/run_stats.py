"""``RunStats``: what a run measures while it trains, each training batch timed and counted once:
throughput, seconds per epoch and peak memory (``stats``), a per-epoch ``history`` that every checkpoint
carries, and the share of a step spent waiting for input (docs/runs.md). Samples and tokens in a batch:
``batch_samples``/``batch_tokens`` of your module, else Lightning's ``extract_batch_size`` (docs/contract.md).
"""

from __future__ import annotations

import logging
import resource
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ThroughputMonitor
from lightning.pytorch.utilities.data import extract_batch_size

log = logging.getLogger(__name__)

# A step's loss is a spike when it is more than twice the median of the steps before it and gives
# back at least half of what the run had gained since its first steps.
_SPIKE_WINDOW = 20
_SPIKE_RATIO = 2.0
_SPIKE_GIVEN_BACK = 0.5
_FIRST_STEPS = 5  # the run's starting loss: the mean of its first micro-batches
_MAX_METRICS = 8  # logged metrics kept per epoch
_WAIT_WARMUP_BATCHES = 3  # batches before the input wait is measured


def throughput_monitor(window_size: int = 20) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor, counting samples as RunStats does by default."""
    return ThroughputMonitor(batch_size_fn=extract_batch_size, window_size=window_size)


def _torch_flags() -> dict[str, Any]:
    """The process-wide torch settings that change what or how a run computes."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_algorithms_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "anomaly_detection": torch.is_anomaly_enabled(),
        "anomaly_check_nan": torch.is_anomaly_check_nan_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "num_threads": torch.get_num_threads(),
    }


def count_spikes(losses: list[float], recent: list[float], start_loss: float | None) -> int:
    """Loss spikes in ``losses`` (in order), each judged against the ``_SPIKE_WINDOW`` losses before it
    (``recent`` holds those of earlier epochs and is updated in place)."""
    spikes = 0
    for loss in losses:
        if len(recent) >= _SPIKE_WINDOW:
            typical = statistics.median(recent)
            gained = (start_loss - typical) if start_loss is not None else 0.0
            if loss > max(_SPIKE_RATIO * typical, typical + _SPIKE_GIVEN_BACK * gained):
                spikes += 1
        recent.append(loss)
        del recent[:-_SPIKE_WINDOW]
    return spikes


class RunStats(Callback):
    """Fills ``stats``, ``history`` and ``input_wait``; ``monitor`` (``optimized_metric``) leads each
    validated epoch's metrics. Samples/s counts all ranks' samples after ``warmup_steps`` optimizer
    steps, without validation or the steps skipped by the NonFiniteLossGuard whose report is ``skips``.
    On CUDA it synchronises only where a timing window opens or closes: a sync per batch would stall
    the queue it measures."""

    def __init__(
        self, monitor: str | None = None, warmup_steps: int = 5, skips: dict[str, Any] | None = None
    ) -> None:
        self.monitor, self.warmup_steps = monitor, warmup_steps
        self.stats: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.input_wait: dict[str, Any] = {}
        self.torch_flags: dict[str, Any] = {}
        self._trainer: L.Trainer | None = None
        self._first_step = self._step = 0  # trainer.global_step at train start, at the last step's end
        self._samples = self._tokens = 0  # timed, of the steps trained
        self._step_samples = self._step_tokens = 0  # timed, in the optimizer step under way
        self._seconds = 0.0
        self._window_start: float | None = None
        self._count_samples: Any = extract_batch_size  # or the module's batch_samples
        self._count_tokens: Any = None  # the module's batch_tokens, if it has one
        self._skips = skips  # NonFiniteLossGuard's report: its skipped steps took time but trained nothing
        self._skips_seen = 0
        self._epoch_start: float | None = None  # None in the epoch a resumed fit joins mid-way
        self._epoch_seconds: list[float] = []
        # Input wait: from one batch's end to the next one's start, across neither validation nor epochs.
        self._wait_s = self._busy_s = 0.0
        self._batches = self._waits = 0
        self._batch_start = 0.0
        self._last_end: float | None = None
        self._pending: dict[str, Any] | None = None  # this epoch's entry, until its metrics are logged
        self._losses: list[torch.Tensor] = []  # this epoch's micro-batch losses, left on the device
        self._recent: list[float] = []  # the last _SPIKE_WINDOW losses, across epochs
        self._start_loss: float | None = None
        self._all_samples = 0  # of every batch trained, resumed runs' included
        self._earlier_seconds = 0.0  # training time of the attempts before a resume
        self._started: float | None = None
        self._validated = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Peaks count from here: not an earlier run in this process (a sweep's job), nor the imports.
        _reset_peak_memory(trainer.strategy.root_device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.torch_flags = _torch_flags()  # as while training: Lightning sets some around fit
        samples, tokens = getattr(pl_module, "batch_samples", None), getattr(pl_module, "batch_tokens", None)
        self._count_samples = samples if callable(samples) else extract_batch_size
        self._count_tokens = tokens if callable(tokens) else None
        self._skips_seen = self._skips["skipped_steps"] if self._skips else 0
        self._step = self._first_step = trainer.global_step
        self._started = time.perf_counter()

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def _close_window(self, trainer: L.Trainer) -> None:
        if self._window_start is not None:
            self._seconds += self._now(trainer) - self._window_start
        self._window_start = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._complete_pending()
        self._validated = False
        self._epoch_start = self._now(trainer)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = self._batch_start = time.perf_counter()
        if self._last_end is not None and self._batches >= _WAIT_WARMUP_BATCHES:
            self._wait_s += now - self._last_end
            self._waits += 1
        if self._window_start is None and trainer.global_step - self._first_step >= self.warmup_steps:
            self._window_start = self._now(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self._last_end = time.perf_counter()
        if self._batches >= _WAIT_WARMUP_BATCHES:
            self._busy_s += now - self._batch_start
        self._batches += 1
        samples = int(self._count_samples(batch)) * trainer.world_size
        self._all_samples += samples
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            # No .item(), no arithmetic: either would wait for the GPU or launch a kernel every step.
            self._losses.append(loss.detach().reshape(()))
        if self._window_start is not None:
            self._step_samples += samples
            if self._count_tokens is not None:
                self._step_tokens += int(self._count_tokens(batch)) * trainer.world_size
        if trainer.global_step == self._step:
            return  # mid-step: its samples count once it is known to be trained
        self._step = trainer.global_step
        if self._skips is not None and self._skips["skipped_steps"] != self._skips_seen:
            self._skips_seen = self._skips["skipped_steps"]
        else:
            self._samples += self._step_samples
            self._tokens += self._step_tokens
        self._step_samples = self._step_tokens = 0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window(trainer)  # validation is not training time
        self._last_end = None  # nor is the wait across it the input pipeline's

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window(trainer)
        if self._epoch_start is not None:  # Lightning starts no epoch that a resumed fit joins
            self._epoch_seconds.append(self._now(trainer) - self._epoch_start)
        self._last_end = None
        # Metrics that the module logs in its own on_train_epoch_end arrive after this hook (Lightning
        # calls callbacks first): the entry is completed at the next epoch, the end, or a checkpoint.
        self._pending = self._epoch_entry(trainer)

    def _epoch_entry(self, trainer: L.Trainer) -> dict[str, Any]:
        # Lightning divides the loss it hands over by the accumulation.
        scale = trainer.accumulate_grad_batches
        losses = torch.stack(self._losses).float() * scale if self._losses else torch.zeros(0)
        self._losses = []
        finite = losses[torch.isfinite(losses)]
        sums = torch.stack([finite.sum(), finite.new_tensor(float(finite.numel()))])
        loss_sum, count = trainer.strategy.reduce(sums.to(trainer.strategy.root_device), reduce_op="sum")
        local = [float(v) for v in finite.cpu()]  # one copy from the device an epoch
        if self._start_loss is None and local:
            self._start_loss = statistics.fmean(local[:_FIRST_STEPS])
        entry: dict[str, Any] = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "wall_s": round(self._training_seconds(), 3),
            "samples": self._all_samples,
            "train_loss": float(loss_sum / count) if count else None,
            "loss_spikes": count_spikes(local, self._recent, self._start_loss),
        }
        if not self.history:
            entry["train_loss_start"] = self._start_loss  # the doctor's "still where it started"
        return entry

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window(trainer)  # max_steps can end training mid-epoch
        self._complete_pending()
        total = self._wait_s + self._busy_s
        self.input_wait.update(
            share=round(self._wait_s / total, 4) if total > 0 and self._waits else None,
            wait_s=round(self._wait_s, 3),
            step_s=round(self._busy_s, 3),
            batches=self._waits,
        )
        samples_per_second = self._samples / self._seconds if self._seconds > 0 else None
        epochs = self._epoch_seconds[1:] or self._epoch_seconds  # the first epoch includes warm-up
        tokens_per_second = (
            self._tokens / self._seconds if self._count_tokens is not None and self._seconds > 0 else None
        )
        self.stats = {
            "samples_per_second": samples_per_second,
            "tokens_per_second": tokens_per_second,
            "steady_state_samples": self._samples,  # of the steps trained
            "warmup_steps": self.warmup_steps,
            "seconds_per_epoch": statistics.median(epochs) if epochs else None,
            "memory": _peak_memory(trainer),
        }
        if trainer.is_global_zero and samples_per_second is not None:
            metrics = {"throughput/samples_per_second": samples_per_second}
            if tokens_per_second is not None:
                metrics["throughput/tokens_per_second"] = tokens_per_second
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
            log.info(
                "throughput: %.1f samples/s (steady state, %d samples), %.2f s per epoch",
                samples_per_second,
                self._samples,
                self.stats["seconds_per_epoch"] or 0.0,
            )

    def _training_seconds(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self._earlier_seconds + running

    def _complete_pending(self) -> None:
        if self._pending is None:
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
        names = sorted(scalars, key=lambda name: (name != self.monitor, name))[:_MAX_METRICS]
        return {name: scalars[name] for name in names}

    @property
    def state_key(self) -> str:
        return "TrainingHistory"  # its state's key when another callback kept it: older checkpoints resume

    def state_dict(self) -> dict[str, Any]:
        # Lightning asks for this while writing a checkpoint, after the module's epoch-end logging.
        self._complete_pending()
        return {
            "history": list(self.history),
            "samples": self._all_samples,
            "seconds": self._training_seconds(),
            "start_loss": self._start_loss,
            "recent": list(self._recent),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._trainer is not None and self._trainer.state.fn != "fit":
            return  # trainer.test(ckpt_path=best) restores callbacks too: keep the whole run's history
        self.history[:] = state_dict.get("history", [])  # in place: summary.json holds this list
        self._all_samples = int(state_dict.get("samples", 0))
        self._earlier_seconds = float(state_dict.get("seconds", 0.0))
        self._start_loss = state_dict.get("start_loss")
        self._recent = list(state_dict.get("recent", []))


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux >= 4.0: "5" resets the process's peak RSS (VmHWM) to its current RSS
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        log.debug("peak RSS cannot be reset here; it counts from the start of the process")


def _peak_rss_bytes() -> float:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024  # in kB
    except OSError:
        pass
    # Elsewhere: the peak since the process started (ru_maxrss is in KiB on Linux, bytes on macOS).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak) if sys.platform == "darwin" else peak * 1024.0


def _peak_memory(trainer: L.Trainer) -> dict[str, Any]:
    """Peak memory of every rank since fitting started, gathered to all: CUDA allocator peaks, or
    peak RSS on CPU."""
    device = trainer.strategy.root_device
    cuda = device.type == "cuda"
    peaks = [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)] if cuda else []
    local = torch.tensor(peaks or [_peak_rss_bytes()], dtype=torch.float64, device=device if cuda else "cpu")
    gathered = trainer.strategy.all_gather(local).reshape(-1, local.numel()).cpu() / 2**20
    columns = (
        ("max_allocated_mib_per_rank", "max_reserved_mib_per_rank") if cuda else ("peak_rss_mib_per_rank",)
    )
    memory: dict[str, Any] = {"kind": "cuda" if cuda else "cpu_rss"}
    memory.update({name: [round(float(v), 1) for v in gathered[:, k]] for k, name in enumerate(columns)})
    memory["peak_mib"] = round(float(gathered[:, 0].max()), 1)
    return memory
