"""Problems a user can fix (``LitlabError``, one sentence naming the value and what to do), the exit
codes, the one-line forms of errors, and checks and warnings of a run's setup once torch is loaded.
"""

from __future__ import annotations

import logging
import signal

from hydra.errors import CompactHydraException
from omegaconf import DictConfig

log = logging.getLogger("litlab")

# How every litlab command and sweep job ends (docs/runs.md): the one table of exit codes.
EXIT_FAILED = 1  # a run failed (while training, a hang, a lost rank) or a sweep has unfinished rows
EXIT_REFUSED = 2  # bad input, refused before anything ran
EXIT_PREEMPTED = 128 + 15  # SIGTERM (a spot VM, Slurm): what a shell reports for a process it ended
ERROR_PREFIX = "litlab: error: "


def error_line(reason: object) -> str:
    """The one form of a one-line error: ``litlab: error: <reason>``, on one line."""
    return ERROR_PREFIX + one_line(reason)


def first_line(text: object) -> str:
    """The first line of ``text`` (an error's message), its runs of spaces made one."""
    return one_line(str(text).strip().split("\n", 1)[0]) or one_line(text)


def one_line(text: object) -> str:
    """``text`` on one line; an error with no message is named by its type."""
    line = " ".join(str(text).split())
    return line or (type(text).__name__ if isinstance(text, BaseException) else "")


class LitlabError(CompactHydraException):
    """A problem the user can fix; ``reason`` is one sentence naming the value and what to do."""

    exit_code = EXIT_REFUSED  # bad input, as preflight's; failures during training use EXIT_FAILED

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:  # the same form as preflight's lines
        return error_line(self.reason)


def describe_exit(returncode: int, guess: bool = True) -> str:
    """How a process ended: "exited with status 1", "was killed by SIGKILL (out of memory?)" (``guess``)."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"was killed by signal {-returncode}"
    return f"was killed by {name}" + (" (out of memory?)" if guess and name == "SIGKILL" else "")


def error_chain(error: BaseException) -> list[BaseException]:
    """The error and those it was raised from or while handling, innermost last."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def forked_rank_failure(error: BaseException) -> str | None:
    """Which ``strategy=ddp_notebook`` rank failed and why, from the error torch.multiprocessing raises
    in the process that forked the ranks; None for other errors."""
    names = {cls.__name__ for cls in type(error).__mro__}
    rank = getattr(error, "error_index", "?")
    if "ProcessRaisedException" in names:
        last = [line for line in str(getattr(error, "msg", error)).splitlines() if line.strip()][-1]
        kind, _, message = last.partition(": ")
        if message.startswith(ERROR_PREFIX):
            return f"rank {rank}: {message.removeprefix(ERROR_PREFIX)}"
        return f"rank {rank} failed: {kind.rsplit('.', 1)[-1]}: {message}"
    if "ProcessExitedException" in names:
        how = f"was killed by {error.signal_name}" if getattr(error, "signal_name", None) else "exited"
        return f"rank {rank} {how} (exit code {getattr(error, 'exit_code', '?')})"
    return None


def check_gpus_available(node: DictConfig, prefix: str = "trainer.") -> None:
    """A LitlabError when ``node.accelerator``/``node.devices`` ask for more GPUs than this machine has."""
    import torch

    accelerator, devices = str(node.get("accelerator", "auto")), node.get("devices", "auto")
    if accelerator not in ("gpu", "cuda") or devices == "auto":
        return
    available = torch.cuda.device_count()
    if isinstance(devices, int) or (isinstance(devices, str) and devices.strip().isdigit()):
        wanted = int(devices)
        too_many = wanted > available
    else:  # device indices, as a list or "0,1"
        indices = [
            int(d) for d in (devices.split(",") if isinstance(devices, str) else devices) if str(d).strip()
        ]
        wanted, too_many = len(indices), any(i >= available for i in indices)
    if too_many:
        allowed = f"use {prefix}devices=1 to {available}" if available else f"use {prefix}accelerator=cpu"
        raise LitlabError(
            f"{prefix}accelerator={accelerator} {prefix}devices={devices} asks for {wanted} GPU(s) but "
            f"this machine has {available}: {allowed}"
        )


def warn_about_setup(cfg: DictConfig, world_size: int) -> None:
    """Warnings for configs that run but are probably not what was meant."""
    if cfg.strategy.name in ("ddp", "ddp_notebook", "fsdp") and world_size == 1:
        log.warning(
            "strategy=%s with trainer.devices=%s and trainer.num_nodes=%s runs one process: %s adds "
            "only overhead; use trainer.devices=N for N ranks, or strategy=auto",
            cfg.strategy.name,
            cfg.trainer.get("devices", "auto"),
            cfg.trainer.get("num_nodes", 1),
            cfg.strategy.name,
        )
