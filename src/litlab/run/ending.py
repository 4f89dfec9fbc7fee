"""How a failing run ends: ``litlab: error: <sentence>`` as stderr's last line (``one_line_errors``;
``HYDRA_FULL_ERROR=1`` and multiruns raise it on) and the reason summary.json records
(``failure_reason``); in a multi-rank run, the same line on every rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.utilities.exceptions import MisconfigurationException

from litlab.config.rules import ConfigError
from litlab.errors import EXIT_FAILED, LitlabError, error_line, forked_rank_failure, one_line
from litlab.run.failures import current_world, lost_a_peer
from litlab.run.hangs import follow_an_ending_run

log = logging.getLogger("litlab")


def failure_reason(error: BaseException) -> str:
    """The text summary.json records for a failed run: in a multi-rank run, which rank failed and why."""
    world = current_world()
    if world is not None and not isinstance(error, (SystemExit, KeyboardInterrupt)):
        if id(error) not in world.explained:
            follow_an_ending_run()  # the ranks are ending a hang or a preemption: this rank ends as they do
        return world.explain(error)
    if isinstance(error, LitlabError):
        return error.reason
    return forked_rank_failure(error) or f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Ends a LitlabError, and an error that means "change the config" (ConfigError, Lightning's
    MisconfigurationException), in one line, logged to train.log too; in a multi-rank run every error,
    naming the rank that failed and why (this rank's traceback goes to train.log)."""
    try:
        try:
            yield
        except (ConfigError, MisconfigurationException) as error:
            raise LitlabError(one_line(error)) from error  # Lightning's span lines
    except LitlabError as error:
        log.error(error.reason)
        _exit_in_one_line(error, error.exit_code)
    except Exception as error:
        forked = forked_rank_failure(error)
        if forked is not None:  # strategy=ddp_notebook: the forked rank's traceback came as text
            log.error(forked)
            _exit_in_one_line(LitlabError(forked), EXIT_FAILED)
        world = current_world()
        if world is None:
            raise
        log.error("rank %d stopped", world.rank, exc_info=not lost_a_peer(error))
        _exit_in_one_line(error, EXIT_FAILED)


def _exit_in_one_line(error: BaseException, exit_code: int) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or HydraConfig.get().mode != RunMode.RUN:
        raise error
    reason = failure_reason(error)
    if (world := current_world()) is not None:
        world.stop()  # peers waiting in a collective with this rank fail now, not at the timeout
    sys.stderr.write(error_line(reason) + "\n")  # the last line of stderr, like preflight's
    sys.exit(exit_code)
