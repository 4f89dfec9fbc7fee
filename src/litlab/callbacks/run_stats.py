"""``RunStats``: steady-state speed and peak memory of a run, for summary.json, the logger and sweep reports.

Samples in a batch: Lightning's ``extract_batch_size``, unless your LightningModule defines
``batch_samples(batch) -> int``; tokens only when it defines ``batch_tokens(batch) -> int`` (then
summary.json has ``tokens_per_second``).
"""

from __future__ import annotations

import logging
import resource
import statistics
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ThroughputMonitor
from lightning.pytorch.utilities.data import extract_batch_size

from litlab.callbacks.combined import parts_of
from litlab.callbacks.nonfinite import NonFiniteLossGuard

log = logging.getLogger(__name__)


def throughput_monitor(window_size: int = 20) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor, counting samples as RunStats does by default."""
    return ThroughputMonitor(batch_size_fn=extract_batch_size, window_size=window_size)


def batch_samples(pl_module: L.LightningModule, batch: Any) -> int:
    """Samples in a batch: the module's own count if it has one, else Lightning's guess."""
    count = getattr(pl_module, "batch_samples", None)
    return int(count(batch)) if callable(count) else extract_batch_size(batch)


def torch_flags() -> dict[str, Any]:
    """The process-wide torch settings that change what or how a run computes (summary.json
    records them as they were while training)."""
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


class RunStats(Callback):
    """Measures samples/s over the steady state (after ``warmup_steps`` optimizer steps, with
    validation excluded), training time per epoch, and peak memory of every rank.

    Works under DDP (every rank times its own batches; samples count across ranks) and with gradient
    accumulation (every micro-batch counts its samples; warm-up counts optimizer steps, so at a fixed
    global batch every configuration times the same samples); the samples of optimizer steps that
    ``NonFiniteLossGuard`` skipped (``on_nonfinite=skip``) do not count. On CUDA it synchronises only
    where a timing window opens or closes (a few times an epoch), never per batch: a per-batch sync
    would stop the CPU from queueing the next step while the GPU works, and slow the run it measures.
    """

    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.stats: dict[str, Any] = {}
        self._first_step = 0  # trainer.global_step when this process started training
        self._samples = self._tokens = 0  # timed, of the steps trained
        self._seconds = 0.0
        self._window_start: float | None = None  # perf_counter when the current window opened
        self._count_tokens: Any = None  # the module's batch_tokens, if it has one
        self._skips: dict[str, Any] | None = None  # the report of a guard that skips non-finite steps
        self._skips_seen = 0  # its skipped_steps when the last optimizer step ended
        self._step = 0  # trainer.global_step when the last optimizer step ended
        self._step_samples = self._step_tokens = 0  # timed in the optimizer step under way
        self._epoch_start: float | None = None
        self._epoch_seconds: list[float] = []
        self.torch_flags: dict[str, Any] = {}

    def on_fit_start(self, trainer, pl_module) -> None:
        # Peaks count from here: an earlier run in this process (a sweep's previous job) or the
        # imports before it must not be in this run's figure.
        _reset_peak_memory(trainer.strategy.root_device)

    def on_train_start(self, trainer, pl_module) -> None:
        # As they are while training (Lightning sets some in Trainer(), anomaly mode around fit).
        self.torch_flags = torch_flags()
        count = getattr(pl_module, "batch_tokens", None)
        self._count_tokens = count if callable(count) else None
        skipping = (
            p for p in parts_of(trainer.callbacks) if isinstance(p, NonFiniteLossGuard) and p.action == "skip"
        )
        self._skips = next((guard.report for guard in skipping), None)
        self._skips_seen = self._skips["skipped_steps"] if self._skips else 0
        self._step = self._first_step = trainer.global_step

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def _close_window(self, trainer: L.Trainer) -> None:
        if self._window_start is not None:
            self._seconds += self._now(trainer) - self._window_start
        self._window_start = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._epoch_start = self._now(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._window_start is None and trainer.global_step - self._first_step >= self.warmup_steps:
            self._window_start = self._now(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._window_start is not None:
            self._step_samples += batch_samples(pl_module, batch) * trainer.world_size
            if self._count_tokens is not None:
                self._step_tokens += int(self._count_tokens(batch)) * trainer.world_size
        if trainer.global_step == self._step:
            return  # mid-step: its samples count once it is known to be trained
        self._step = trainer.global_step
        if self._skips is not None and self._skips["skipped_steps"] != self._skips_seen:
            self._skips_seen = self._skips["skipped_steps"]  # its samples took time but were not trained
        else:
            self._samples += self._step_samples
            self._tokens += self._step_tokens
        self._step_samples = self._step_tokens = 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self._close_window(trainer)  # validation is not training time

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close_window(trainer)
        if self._epoch_start is not None:
            self._epoch_seconds.append(self._now(trainer) - self._epoch_start)

    def on_train_end(self, trainer, pl_module) -> None:
        self._close_window(trainer)  # max_steps can end training mid-epoch
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
    if device.type == "cuda":
        local = torch.tensor(
            [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
            dtype=torch.float64,
            device=device,
        )
        kind = "cuda"
    else:
        local = torch.tensor([_peak_rss_bytes()], dtype=torch.float64)
        kind = "cpu_rss"
    gathered = trainer.strategy.all_gather(local).reshape(-1, local.numel()).cpu() / 2**20
    if kind == "cuda":
        return {
            "kind": kind,
            "max_allocated_mib_per_rank": [round(float(v), 1) for v in gathered[:, 0]],
            "max_reserved_mib_per_rank": [round(float(v), 1) for v in gathered[:, 1]],
            "peak_mib": round(float(gathered[:, 0].max()), 1),
        }
    return {
        "kind": kind,
        "peak_rss_mib_per_rank": [round(float(v), 1) for v in gathered[:, 0]],
        "peak_mib": round(float(gathered[:, 0].max()), 1),
    }
