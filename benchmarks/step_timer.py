"""Bench-only callback: the time at which every optimizer step ends, written to a JSON file.

``litlab-bench`` adds it from the command line (``+callbacks.bench_timer._target_=...``); runs
never use it otherwise. Per step it appends one ``time.perf_counter()`` to a list (well under a
microsecond), so it does not itself add to the overhead it measures. On CUDA it synchronises only
twice (at the end of warm-up and at the last step), so the window between them is exact without
stalling the step pipeline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class StepTimer(Callback):
    """Records when each optimizer step ends (not each micro-batch: accumulation counts once)."""

    def __init__(self, path: str, warmup_steps: int = 5, runner: str = "litlab") -> None:
        self.path = Path(path)
        self.warmup_steps = warmup_steps
        self.runner = runner
        self.step_ends: list[float] = []
        self.step_cpu_ends: list[float] = []  # this thread's CPU time: immune to other processes
        self.first_step_unix: float | None = None
        self.window: dict[str, float] | None = None
        self._last_global_step = 0
        self._window_start: float | None = None

    def _synchronize(self, trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_global_step:  # a micro-batch that accumulated gradients, no step
            return
        self._last_global_step = step
        if step == 1 or step == self.warmup_steps or step == trainer.max_steps:
            self._synchronize(trainer)
        now = time.perf_counter()
        self.step_ends.append(now)
        self.step_cpu_ends.append(time.thread_time())
        if step == 1:
            self.first_step_unix = time.time()
        if step == self.warmup_steps:
            self._window_start = now
        if step == trainer.max_steps and self._window_start is not None:
            self.window = {"steps": step - self.warmup_steps, "seconds": now - self._window_start}

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.result(trainer), indent=1) + "\n")

    def result(self, trainer: L.Trainer) -> dict[str, Any]:
        device = trainer.strategy.root_device
        return {
            "runner": self.runner,
            "module": type(trainer.lightning_module).__name__,
            "first_step_unix": self.first_step_unix,
            "step_ends": self.step_ends,
            "step_cpu_ends": self.step_cpu_ends,
            "warmup_steps": self.warmup_steps,
            "window": self.window,
            "threads": torch.get_num_threads(),
            "device": str(device),
            "precision": str(trainer.precision),
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "peak_memory_mib": peak_memory_mib(device),
            "backends": backend_settings() if device.type == "cuda" else None,
        }


def peak_memory_mib(device: torch.device) -> float | None:
    """CUDA's peak allocated memory on the device, in MiB (None elsewhere)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def backend_settings() -> dict[str, Any]:
    """The matmul/convolution settings that decide fp32 speed on GPUs (TF32 or not), as they ran."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": cudnn.allow_tf32,
        "cudnn.benchmark": cudnn.benchmark,
        "cudnn.deterministic": cudnn.deterministic,
        "cudnn.version": cudnn.version(),
        "device_name": torch.cuda.get_device_name(),
    }


class HoldAfterTraining(Callback):
    """Bench-only: waits ``seconds`` after training, without using the CPU, so sweep jobs have known,
    unequal lengths (the pool-efficiency measure of ``litlab-bench``'s sweep section)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_end(self, trainer, pl_module) -> None:
        time.sleep(self.seconds)
