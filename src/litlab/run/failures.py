"""When one rank of a multi-rank run fails, every rank stops soon and says which rank and why, in one line:
a rank that raises records why in the ranks' store and closes its process group (peers in a collective
fail at once and read it); one that dies without a word is named by the ranks on its machine (``World``).
docs/launch.md, "When a rank fails".
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch

from litlab import heartbeat
from litlab.errors import LitlabError, describe_exit, error_chain, one_line
from litlab.library_internals import default_store, take_child_processes
from litlab.storage.checkpoints import kept_checkpoint

log = logging.getLogger("litlab")

GRACE_S = 30  # after a peer on this machine died: time to notice it through a collective
_RECORD_WAIT_S = 5  # how long a rank that lost a peer waits for the peer's record
_OOM_AGREEMENT_S = 10  # how long a rank out of memory waits for every other rank to say the same
_CHILDREN_EXIT_S = 30  # how long Lightning's launching process waits for its children at exit
# Collective errors that mean "a peer went away": gloo's transport errors, torch's DistError family.
_PEER_LOST = (
    "gloo/transport",
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL",
    "Broken pipe",
)


@dataclass
class World:
    """This process's view of the ranks of the multi-rank fit it takes part in."""

    trainer: L.Trainer
    rank: int
    size: int
    store: Any  # torch.distributed.Store, shared by every rank
    prefix: str
    peers: dict[int, dict[str, Any]] = field(default_factory=dict)  # heartbeat records, at setup
    children: dict[int, subprocess.Popen] = field(default_factory=dict)  # Lightning's, by global rank
    ended: dict[int, str] = field(default_factory=dict)  # ranks found dead, and how they ended
    explained: dict[int, str] = field(default_factory=dict)  # id(error) -> its one-line reason
    running: bool = True

    def _set(self, key: str, value: dict[str, Any]) -> None:
        try:
            self.store.set(f"{self.prefix}/{key}", json.dumps(value))
        except Exception as error:  # the store's host is gone: nothing more to tell
            log.debug("failures: cannot write %s to the store: %s", key, error)

    def _get(self, key: str) -> dict[str, Any] | None:
        try:
            if not self.store.check([f"{self.prefix}/{key}"]):  # check(): never waits for the key
                return None
            return json.loads(self.store.get(f"{self.prefix}/{key}"))
        except Exception:
            return None

    def register(self) -> None:
        """Tell every rank this rank's heartbeat record (host, pid), and learn theirs."""
        self._set(f"beat/{self.rank}", heartbeat.record())
        keys = [f"{self.prefix}/beat/{rank}" for rank in range(self.size)]
        try:
            self.store.wait(keys, dt.timedelta(seconds=60))
        except Exception as error:
            log.warning(
                "failures: not every rank registered (%s); dead peers are found by their errors", error
            )
        for rank in range(self.size):
            found = self._get(f"beat/{rank}")
            if found is not None:
                self.peers[rank] = found

    def look_at_peers(self) -> dict[int, str]:
        """Ranks on this machine whose process ended, and how."""
        for rank, child in self.children.items():
            code = child.poll()
            if code not in (None, 0) and rank not in self.ended:
                self.ended[rank] = describe_exit(code, guess=False)
        host = socket.gethostname()
        for rank, peer in self.peers.items():
            if rank == self.rank or rank in self.ended or peer["host"] != host or rank in self.children:
                continue
            if not heartbeat.alive(peer["pid"], peer["process_started"]):
                self.ended[rank] = "ended without a word (killed, e.g. by SIGKILL or the kernel's OOM killer)"
        return self.ended

    def peer_cause(self, wait_s: float = _RECORD_WAIT_S) -> str | None:
        """Why the run lost a peer: a rank's record, else a rank found dead; None if neither shows."""
        deadline = time.monotonic() + wait_s
        while True:
            ended = self.look_at_peers()
            # Under Lightning and Slurm rank 0 serves the store: with rank 0 gone there is none to read.
            store_served = "TORCHELASTIC_RUN_ID" in os.environ or 0 not in ended
            for rank in range(self.size) if store_served else ():
                found = self._get(f"failed/{rank}") if rank != self.rank else None
                if found is not None:
                    return found["reason"]
            if ended:
                rank = min(ended)
                return (
                    f"rank {rank}{self._where(rank)} {ended[rank]} at global step {self.trainer.global_step}"
                )
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def _where(self, rank: int) -> str:
        peer = self.peers.get(rank)
        return f" (pid {peer['pid']} on {peer['host']})" if peer else ""

    def explain(self, error: BaseException) -> str:
        """The one-line reason a failure of this rank ends the run, for every rank to print."""
        if id(error) in self.explained:
            return self.explained[id(error)]
        if lost_a_peer(error):
            cause = self.peer_cause() or (
                f"rank {self.rank} lost its connection to another rank ({one_line(error)[:200]}) and no rank "
                "said why (a rank on another machine died, or its machine did)"
            )
        else:
            if isinstance(error, LitlabError):  # already names the step and what to do
                cause = f"rank {self.rank}: {error.reason}"
            else:
                what = one_line(f"{type(error).__name__}: {error}")
                cause = f"rank {self.rank} failed at global step {self.trainer.global_step}: {what}"
            self._set(f"failed/{self.rank}", {"reason": cause})
        reason = f"{cause}; every rank stopped; {kept(self.trainer)}"
        self.explained[id(error)] = reason
        return reason

    def stop(self) -> None:
        """Leave the run: close this rank's connections (a peer in a collective with it fails at once), then
        wait for Lightning's children, so that this process's line is the terminal's last."""
        self.running = False
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            try:
                torch.distributed.destroy_process_group()
            except Exception as error:
                log.debug("failures: destroy_process_group: %s", error)
        self.wait_for_children()

    def wait_for_children(self) -> None:
        deadline = time.monotonic() + _CHILDREN_EXIT_S
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()


_current: World | None = None
_fits = 0  # multi-rank fits this process started (oom=auto_shrink fits again): keys of one are its own


def current_world() -> World | None:
    """The multi-rank fit this process takes part in (kept after the fit, for its failure's line)."""
    return _current


def kept(trainer: L.Trainer) -> str:
    """What a failed run leaves to resume from, as the failure's line says it on this rank."""
    if trainer.is_global_zero:
        return f"{kept_checkpoint(trainer)}: the same command resumes from it"
    return "the same command resumes from the newest checkpoint rank 0 wrote"


def lost_a_peer(error: BaseException) -> bool:
    """Whether an error means a collective lost its connection to another rank."""
    dist_error = getattr(torch.distributed, "DistError", ())
    for chained in error_chain(error):
        if dist_error and isinstance(chained, dist_error):
            return True
        if isinstance(chained, RuntimeError) and any(marker in str(chained) for marker in _PEER_LOST):
            return True
    return False


def join_the_world(trainer: L.Trainer) -> None:
    """Sets up ``World`` for a multi-rank fit."""
    global _current, _fits
    if trainer.world_size < 2 or not torch.distributed.is_initialized():
        return
    if _current is not None:
        _current.running = False  # oom=auto_shrink fits again in the same processes
    _fits += 1
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = default_store()  # the one the ranks rendezvoused in
    # The ranks that exist: a process group smaller than trainer.world_size (WorldCheck stops the
    # run on it) would otherwise wait a minute here for ranks that never register.
    members = torch.distributed.get_world_size()
    world = World(trainer, trainer.global_rank, members, store, f"litlab/{restart}/{_fits}")
    # The ranks Lightning's launcher started from this process, taken from its observer thread (which
    # would SIGKILL this process when a child fails: World reports and ends instead).
    first = trainer.node_rank * trainer.num_devices
    procs = take_child_processes(trainer.strategy.launcher)
    world.children = {first + local_rank: proc for local_rank, proc in enumerate(procs, start=1)}
    world.register()
    _current = world
    if world.children:
        atexit.register(world.wait_for_children)  # an exit of any kind: the children end first


def every_rank_out_of_memory(step: int, attempt: int) -> bool:
    """``oom=auto_shrink``: True when every rank ran out of memory in the same step (all shrink), False
    when one did not say so in time (it waits in a collective: all fail)."""
    world = current_world()
    if world is None:
        return True
    world._set(f"oom/{attempt}/{world.rank}", {"step": step})
    deadline = time.monotonic() + _OOM_AGREEMENT_S
    while time.monotonic() < deadline:
        steps = [world._get(f"oom/{attempt}/{rank}") for rank in range(world.size)]
        if all(s is not None for s in steps):
            return len({s["step"] for s in steps}) == 1
        time.sleep(0.1)
    return False
