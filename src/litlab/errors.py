"""Problems a user can fix, reported as one line, and warnings for setups that run but mislead.

``preflight`` catches what the config alone shows, before torch loads. What shows only afterwards
(no such GPU, a file that is not a checkpoint, weights of another model, a non-finite loss, out of
memory) is raised as a ``LitlabError`` inside ``one_line_errors()``. In a single run that prints
``litlab: error: <sentence>`` as the last line of stderr and exits: Hydra would print its
"Set the environment variable HYDRA_FULL_ERROR=1" hint after any error, even a compact one. With
``HYDRA_FULL_ERROR=1`` the error is raised on, traceback and all. In a multirun, where a job failure
must stay a failed job and not end the sweep, it is raised on to Hydra, which prints a
``CompactHydraException`` without a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from litlab.config.rules import ConfigError

log = logging.getLogger("litlab")


class LitlabError(CompactHydraException):
    """A problem the user can fix; ``reason`` is one sentence naming the value and what to do."""

    exit_code = 2  # bad input, as preflight's; failures during training use 1

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:  # the same form as preflight's lines
        return f"litlab: error: {self.reason}"


def error_chain(error: BaseException) -> list[BaseException]:
    """The error and those it was raised from or while handling, innermost last."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def failure_reason(error: BaseException) -> str:
    """The text summary.json records for a failed run: in a multi-rank run, which rank failed and why."""
    world = _multi_rank_world()
    if world is not None and not isinstance(error, (SystemExit, KeyboardInterrupt)):
        return world.explain(error)
    if isinstance(error, LitlabError):
        return error.reason
    return spawned_rank_failure(error) or f"{type(error).__name__}: {error}"


def spawned_rank_failure(error: BaseException) -> str | None:
    """Which ``strategy=ddp_spawn`` rank failed and why, from the error torch.multiprocessing raises in
    the launching process (it carries the rank's traceback as text); None for other errors."""
    names = {cls.__name__ for cls in type(error).__mro__}
    rank = getattr(error, "error_index", "?")
    if "ProcessRaisedException" in names:
        last = [line for line in str(getattr(error, "msg", error)).splitlines() if line.strip()][-1]
        kind, _, message = last.partition(": ")
        if message.startswith("litlab: error: "):
            return f"rank {rank}: {message.removeprefix('litlab: error: ')}"
        return f"rank {rank} failed: {kind.rsplit('.', 1)[-1]}: {message}"
    if "ProcessExitedException" in names:
        how = f"was killed by {error.signal_name}" if getattr(error, "signal_name", None) else "exited"
        return f"rank {rank} {how} (exit code {getattr(error, 'exit_code', '?')})"
    return None


def _multi_rank_world():  # noqa: ANN202 - litlab.launch.failures.World, imported only once a fit used it
    failures = sys.modules.get("litlab.launch.failures")  # loaded by the engine's callbacks, with torch
    return failures.current_world() if failures is not None else None


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turns errors that mean "change the config" (litlab's ConfigError, Lightning's
    MisconfigurationException) into a LitlabError, and logs each LitlabError to train.log too.

    In a multi-rank run every error ends the same way on every rank: one line naming the rank that
    failed and why (``litlab.launch.failures``), the traceback of this rank's own error in train.log.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        try:
            yield
        except (ConfigError, MisconfigurationException) as error:
            raise LitlabError(" ".join(str(error).split())) from error  # Lightning's span lines
    except LitlabError as error:
        log.error(error.reason)
        _exit_in_one_line(error, error.exit_code)
    except Exception as error:
        spawned = spawned_rank_failure(error)
        if spawned is not None:  # strategy=ddp_spawn: the rank's traceback went to its own output
            log.error(spawned)
            _exit_in_one_line(LitlabError(spawned), 1)
        world = _multi_rank_world()
        if world is None:
            raise
        from litlab.launch.failures import lost_a_peer

        log.error("rank %d stopped", world.rank, exc_info=not lost_a_peer(error))
        _exit_in_one_line(error, 1)


def _exit_in_one_line(error: BaseException, exit_code: int) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or HydraConfig.get().mode != RunMode.RUN:
        raise error
    world = _multi_rank_world()
    reason = world.explain(error) if world is not None else error.reason
    if world is not None:
        world.stop()  # peers waiting in a collective with this rank fail now, not at the timeout
    sys.stderr.write(f"litlab: error: {reason}\n")  # the last line of stderr, like preflight's
    sys.exit(exit_code)


def check_gpus_available(node: DictConfig, prefix: str = "trainer.") -> None:
    """A LitlabError when ``node.accelerator``/``node.devices`` ask for more GPUs than this machine
    has (Lightning's own message for that is "No supported gpu backend found!")."""
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
    if cfg.strategy.name in ("ddp", "ddp_spawn", "fsdp") and world_size == 1:
        log.warning(
            "strategy=%s with trainer.devices=%s and trainer.num_nodes=%s runs one process: %s adds "
            "only overhead; use trainer.devices=N for N ranks, or strategy=auto",
            cfg.strategy.name,
            cfg.trainer.get("devices", "auto"),
            cfg.trainer.get("num_nodes", 1),
            cfg.strategy.name,
        )
