"""What one sweep job changes in its process, put back before the next job runs in the same one.

A sweep's jobs run one after another in the sweep's process (Hydra's basic launcher, Optuna) or in
reused worker processes (joblib's loky). Training changes process-wide state that the next job
would inherit, and a job must give the result it gives alone. ``litlab.multirun`` therefore sends
every job that would change state that cannot be put back to a fresh process of its own, and runs
the others inside ``process_state_restored()``, which records and restores, per case:

- ``os.environ``: Lightning sets ``PL_GLOBAL_SEED``, ``CUBLAS_WORKSPACE_CONFIG`` (deterministic),
  litlab its resume decision. Restored whole.
- torch's flags: deterministic algorithms (``trainer.deterministic``), cudnn benchmark
  (``trainer.benchmark``) and deterministic, TF32, float32 matmul precision, anomaly mode
  (``trainer.detect_anomaly``), the default dtype (``*-true`` precisions), grad mode, thread count.
- random number generators: torch (CPU and every initialised CUDA device), numpy, ``random``.
- the default process group, if the job created one (destroyed, so the next job makes its own).
- logging: the handlers, level and propagation of every logger, and the warnings filters.
- the garbage collector: enabled or not, its thresholds, and objects frozen by the job.
- fsspec's per-protocol options (``storage.endpoint_url``...), which litlab sets for a run.

What is sent to a fresh process instead, and why, is in ``litlab.multirun.own_process_reason``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
import random
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _LoggerState:
    handlers: list[logging.Handler]
    level: int
    propagate: bool
    disabled: bool


@dataclass
class ProcessState:
    """A record of the process-wide state a training run can change."""

    environ: dict[str, str]
    torch_flags: dict[str, Any]
    rng: dict[str, Any]
    had_process_group: bool
    loggers: dict[str, _LoggerState]
    warning_filters: list[Any]
    gc_enabled: bool
    gc_threshold: tuple[int, ...]
    gc_frozen: int
    fsspec_options: dict[str, Any]
    cuda_rng: list[Any] = field(default_factory=list)


def torch_flags() -> dict[str, Any]:
    """The process-wide torch settings that change what or how a run computes (summary.json
    records them as they were while training)."""
    import torch

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


def _set_torch_flags(flags: dict[str, Any]) -> None:
    import torch

    torch.use_deterministic_algorithms(
        flags["deterministic_algorithms"], warn_only=flags["deterministic_algorithms_warn_only"]
    )
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn_allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda_matmul_allow_tf32"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    torch.autograd.set_detect_anomaly(flags["anomaly_detection"], check_nan=flags["anomaly_check_nan"])
    torch.set_default_dtype(getattr(torch, flags["default_dtype"].removeprefix("torch.")))
    torch.set_grad_enabled(flags["grad_enabled"])
    if torch.get_num_threads() != flags["num_threads"]:
        torch.set_num_threads(flags["num_threads"])


def _process_group_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _loggers() -> dict[str, logging.Logger]:
    manager = logging.Logger.manager
    named = {name: lg for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    return {"": logging.getLogger(), **named}


def record() -> ProcessState:
    """The state a run may change, as it is now."""
    import fsspec
    import numpy as np
    import torch

    state = ProcessState(
        environ=dict(os.environ),
        torch_flags=torch_flags(),
        rng={"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()},
        had_process_group=_process_group_initialized(),
        loggers={
            name: _LoggerState(list(lg.handlers), lg.level, lg.propagate, lg.disabled)
            for name, lg in _loggers().items()
        },
        warning_filters=list(warnings.filters),
        gc_enabled=gc.isenabled(),
        gc_threshold=gc.get_threshold(),
        gc_frozen=gc.get_freeze_count(),
        fsspec_options=copy.deepcopy(fsspec.config.conf),
    )
    if torch.cuda.is_initialized():
        state.cuda_rng = torch.cuda.get_rng_state_all()
    return state


def restore(state: ProcessState) -> None:
    """Put the process back into ``state``."""
    import fsspec
    import numpy as np
    import torch

    os.environ.clear()
    os.environ.update(state.environ)
    _set_torch_flags(state.torch_flags)
    torch.set_rng_state(state.rng["torch"])
    np.random.set_state(state.rng["numpy"])
    random.setstate(state.rng["random"])
    if state.cuda_rng:
        torch.cuda.set_rng_state_all(state.cuda_rng)
    if not state.had_process_group and _process_group_initialized():
        torch.distributed.destroy_process_group()
    loggers = _loggers()
    for name, logger in loggers.items():
        before = state.loggers.get(name)
        if before is None:  # made by the job: it keeps its level, but no handler of the job's
            logger.handlers.clear()
            continue
        logger.handlers[:] = before.handlers
        logger.setLevel(before.level)
        logger.propagate, logger.disabled = before.propagate, before.disabled
    warnings.filters[:] = state.warning_filters
    # The per-module "already warned" caches must follow the filters again (what
    # warnings.filterwarnings does after it changes them; private, hence the guard).
    getattr(warnings, "_filters_mutated", lambda: None)()
    if state.gc_frozen == 0 and gc.get_freeze_count():
        gc.unfreeze()  # the job's frozen objects become collectable again
    gc.set_threshold(*state.gc_threshold)
    (gc.enable if state.gc_enabled else gc.disable)()
    fsspec.config.conf.clear()
    fsspec.config.conf.update(state.fsspec_options)
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Run the block, then put back the process-wide state it changed (even when it raised).

    Lightning and litlab's training code are imported first: what importing them does once (set
    variables, add warning filters, create loggers) belongs to the process, not to a job.
    """
    import litlab.run.build  # noqa: F401  (imports lightning, torch and the engine's import-time settings)

    state = record()
    try:
        yield
    finally:
        restore(state)
        sys.stdout.flush()
