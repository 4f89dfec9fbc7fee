"""This rank's watch (``RankWatch``): a SIGTERM stops every rank at the same batch; a dead peer on this
machine, a rank without progress, or a stop that misses ``preempt_grace`` ends the run in one line.
``Watchdog`` shares the heartbeat records through the ranks' store. docs/launch.md, "When a rank hangs".
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import psutil
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab import heartbeat
from litlab.callbacks.nonfinite import sum_over_ranks
from litlab.errors import EXIT_FAILED, EXIT_PREEMPTED, error_line
from litlab.heartbeat import HEARTBEAT
from litlab.library_internals import accumulating, cluster_environment, raise_sigterm_after_this_batch
from litlab.run import failures
from litlab.storage.checkpoints import in_an_epochs_last_batch, newest_checkpoint

log = logging.getLogger("litlab")

_END_WITHIN_S = 45  # after deciding to end: stacks, summary.json, the children; then faulthandler ends it
_SUMMARY_WAIT_S = 10  # a summary.json write to a storage that stalls too is given up after this
_PY_SPY_S = 15  # for all of py-spy's dumps together
_SILENT_AFTER_POLLS = 5  # a record this many polls old counts as stalled: that rank's watchdog cannot run


def poll_interval(hang_timeout: float, preempt_grace: float) -> float:
    """How often the watchdog looks: a twentieth of the shortest limit, between 0.1 s and 1 s."""
    limits = [s for s in (hang_timeout, preempt_grace) if s > 0]
    return min(1.0, max(0.1, min(limits, default=20) / 20))


class RankWatch(Callback):
    """From setup to teardown: the ranks' ``World``, the watchdog, beats at the start of the loop's hooks
    (before your callbacks'), and after a SIGTERM on any rank a stop of every rank at one batch boundary
    (at an epoch's end after its validation and checkpoints; with accumulation at the window's optimizer
    step), where ``PreemptionCheckpoint`` writes preempted.ckpt; the run exits 143. Slurm's requeue
    signal (``--signal=USR1@90``) does the same, then rank 0 runs ``scontrol requeue``: Lightning's
    auto-requeue saves inside its signal handler (a collective there pairs with whatever the other
    ranks do), where resume never looks."""

    def __init__(self, cfg: Any, run: Any, record_failure: Callable[..., Any]) -> None:
        # run: a litlab.run.lifecycle.Run; record_failure(trainer, status=, error=) writes summary.json.
        self.run, self.record_failure = run, record_failure
        self.hang_timeout, self.preempt_grace = float(cfg.hang_timeout), float(cfg.preempt_grace)
        self.run_dir = Path(run.dir)
        self.trained = False  # a first training batch ended in this process
        self.validated = False  # a first validation (not the sanity check) started in this process
        self.watchdog: Watchdog | None = None

    # --- the watch's life --------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            failures.join_the_world(trainer)
        self.requested = self.requeue = self.at_epoch_end = False  # a stop for a SIGTERM
        self.boundary_reached = False  # every rank agreed to stop there: preempt_grace no longer counts
        self.training = False  # between on_train_start and the end of the fit
        self.stop_agreed = False  # under DDP: a rank was asked to stop, as all learnt it at one step
        self.stopping = False  # Lightning was told to stop after this batch
        environment = cluster_environment(trainer)  # Slurm's requeue signal (--signal=USR1@90) stops it too
        requeue = environment.requeue_signal if isinstance(environment, SLURMEnvironment) else None
        self.signals = [signal.SIGTERM] if requeue is None else [signal.SIGTERM, requeue]
        # Before Lightning installs its handlers: it keeps those it finds and puts them back at teardown.
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._keep_through_the_stop(trainer, signum)
        HEARTBEAT.reset()
        HEARTBEAT.beat(heartbeat.STARTING, trainer.global_step, first=not self.trained)
        watchdog = Watchdog(self, trainer)
        if self.hang_timeout > 0 or self.preempt_grace > 0 or watchdog.world() is not None:
            self.watchdog = watchdog
            watchdog.start()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not in setup: Lightning installs its own handlers after the setup hooks.
        if threading.current_thread() is not threading.main_thread():
            return
        self.training = True
        for signum in self.signals:
            name = signal.Signals(signum).name
            signal.signal(signum, lambda number, frame, name=name: self._note(trainer, name))
        if self.watchdog is not None:
            self.watchdog.notice_signals()  # in the main thread, as set_wakeup_fd needs

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # fitting ended without a stop
            world = failures.current_world()
            if world is not None:
                world.running = False  # ranks that finished do not watch each other's exit
            restore_signal_handlers()
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, error: BaseException) -> None:
        if isinstance(error, SIGTERMException) and self.watchdog is not None and self.preempt_grace > 0:
            # Stopped for a SIGTERM: from now on the run must make progress towards its end (a
            # checkpoint's bytes count) every preempt_grace seconds; what blocks on the way out (a store
            # whose host is gone) must not keep the process. stop_watching() ends the watch once the
            # outcome is recorded.
            self.watchdog.stopping_at, self.watchdog.stopping_step = time.monotonic(), trainer.global_step
            return
        # Lightning skips teardown after an exception: a failed fit must not leave a watchdog that
        # ends the process later (a notebook, a test that trains in-process).
        self.teardown(trainer, pl_module, "exception")

    # --- a stop for a SIGTERM, every rank at the same batch ----------------------------------------

    def _keep_through_the_stop(self, trainer: L.Trainer, signum: int) -> None:
        """Lightning's teardown after a stop puts back the handler it found at the fit's start, and
        the same signal again would then end the run between preempted.ckpt and summary.json. So the
        handler it finds is this one: it notes the signal while a stop is under way, and otherwise does
        what the handler of before the fit did (``restore_signal_handlers`` puts that one back)."""
        before = _handlers_before_fit.get(signum, signal.getsignal(signum))
        if before is None:  # a handler not installed from Python: left to Lightning
            return
        _handlers_before_fit.setdefault(signum, before)

        def while_stopping(number: int, frame: Any) -> None:
            name = signal.Signals(number).name
            if self.requested:
                log.warning("%s again on rank %d: the run is already stopping", name, trainer.global_rank)
            elif signal.getsignal(number) is not while_stopping:
                return  # called by Lightning's SIGTERM handler (before on_train_start), which notes it
            elif not self.training:
                self._note(trainer, name)  # before training starts: the run stops after its first batch
            elif callable(before):
                before(number, frame)
            elif before != signal.SIG_IGN:  # the default action, as without this handler
                signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)

        signal.signal(signum, while_stopping)

    def _note(self, trainer: L.Trainer, name: str) -> None:
        self.requested = True
        self.requeue = self.requeue or name != "SIGTERM"
        where = "this batch"
        if trainer.world_size > 1:  # the ranks agree at each optimizer step (NonFiniteLossGuard's sum)
            where = "their next optimizer step"
        elif trainer.accumulate_grad_batches > 1:
            where = "the optimizer step that ends this batch's window"
        log.warning(
            "%s on rank %d: every rank stops after %s (or at the epoch's end)",
            name,
            trainer.global_rank,
            where,
        )
        if trainer.world_size == 1 and trainer.accumulate_grad_batches == 1 and not _epoch_ending(trainer):
            self._stop(trainer)  # Lightning stops after the batch in progress

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # A validation under way, or the rest of an accumulation window (whose gradients no checkpoint
        # holds), is finished first, watched by hang_timeout like any other: under DDP the ranks agree
        # at the window's step, whose sum holds this rank's flag, so preempt_grace no longer counts.
        self.boundary_reached = self.boundary_reached or self.requested
        if not (self.requested if trainer.world_size == 1 else self.stop_agreed):
            return
        if _epoch_ending(trainer):
            self.at_epoch_end = True
        elif not accumulating(trainer):
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the epoch's validation; Lightning stops right after the epoch-end checkpoints.
        if self._agreed_now(trainer) or self.at_epoch_end:
            self.boundary_reached = True
            self._stop(trainer)

    def flags(self) -> list[int]:
        """This rank's stop flags, which ``NonFiniteLossGuard`` sums over the ranks at each optimizer
        step, in the all-reduce that step makes anyway: no collective of its own on a batch's path."""
        return [int(self.requested), int(self.requeue)]

    def agreed(self, sums: list[int]) -> None:
        """The ranks' sums of their ``flags``: the same on every rank, at the same step."""
        self.stop_agreed = self.stop_agreed or sums[0] > 0
        self.requeue = self.requeue or sums[1] > 0

    def _agreed_now(self, trainer: L.Trainer) -> bool:
        """Whether any rank was asked to stop; under DDP a sum of the flags (once an epoch)."""
        if trainer.world_size == 1:
            return self.requested
        self.agreed(sum_over_ranks(trainer, self.flags()))
        return self.stop_agreed

    def _stop(self, trainer: L.Trainer) -> None:
        if self.stopping:  # agreed at the last step of a max_steps run, then again at its epoch's end
            return
        self.stopping = True
        raise_sigterm_after_this_batch(trainer)
        if self.requeue and trainer.is_global_zero:
            atexit.register(_requeue_this_job)  # at exit: after preempted.ckpt and summary.json

    # --- beats at the start of hooks ---------------------------------------------------------------

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        HEARTBEAT.beat(heartbeat.TRAINING, trainer.global_step, first=not self.trained)

    on_before_backward = on_before_optimizer_step = on_train_batch_start

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        first = trainer.sanity_checking or not self.validated  # the sanity check, the first real one
        self.validated = self.validated or not trainer.sanity_checking
        HEARTBEAT.beat(heartbeat.VALIDATION, trainer.global_step, first=first)

    def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        HEARTBEAT.beat(heartbeat.VALIDATION, trainer.global_step, first=HEARTBEAT.state.first)

    def on_test_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        HEARTBEAT.beat(heartbeat.TESTING, trainer.global_step, first=HEARTBEAT.state.first)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        HEARTBEAT.beat(heartbeat.TESTING, trainer.global_step, first=True)


class HeartbeatAfterYourCallbacks(Callback):
    """The batch's last beat, after every other callback's ``on_train_batch_end`` (yours included:
    a callback stuck there is in the training step) and before the checkpoint callbacks (they beat
    while writing): from here to the next batch start the rank waits for data."""

    after_your_callbacks = True  # litlab.callbacks.combined: combined, last, only where you have none

    def __init__(self, watch: RankWatch) -> None:
        self.watch = watch

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.watch.trained = True
        HEARTBEAT.beat(heartbeat.DATA, trainer.global_step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            HEARTBEAT.beat(heartbeat.DATA, trainer.global_step, first=not self.watch.trained)


class Watchdog:
    """This rank's watchdog: a job of the process's watchdog thread."""

    def __init__(self, watch: RankWatch, trainer: L.Trainer) -> None:
        self.watch, self.trainer = watch, trainer
        self.rank = trainer.global_rank
        self.poll = poll_interval(watch.hang_timeout, watch.preempt_grace)
        self.polled: dict[int, dict[str, Any]] = {}  # the records the last poll read, this rank's included
        self.peer_lost_at: float | None = None  # when a peer on this machine was found dead
        self.preempted_at: float | None = None
        self.stopping_at: float | None = None  # when the run began to stop at a boundary, for a SIGTERM
        self.stopping_step = 0
        self.signal_pipe: tuple[int, int] | None = None
        self.previous_wakeup_fd = -1
        self.ending = threading.Lock()  # held by the one thread that ends this process
        self.stopped = False
        # So that stop() and stop_watching() never act amid a pipe read, a faulthandler arm or a file write.
        self.lock = threading.Lock()

    def start(self) -> None:
        global _current
        _current = self
        heartbeat.watch("rank", self.poll, self.tick)

    def stop(self) -> None:
        """Ends the watch and gives the wakeup fd back."""
        with self.lock:
            if self.stopped:
                return
            self.stopped = True
            heartbeat.unwatch("rank", self.tick)
            (self.watch.run_dir / f"heartbeat-rank{self.rank}.json").unlink(missing_ok=True)
            if self.signal_pipe is not None:
                if threading.current_thread() is threading.main_thread():
                    with contextlib.suppress(ValueError):
                        signal.set_wakeup_fd(self.previous_wakeup_fd)
                for end in self.signal_pipe:
                    os.close(end)
                self.signal_pipe = None

    def notice_signals(self) -> None:
        """Signals reach a pipe the watchdog reads, even while the main thread is stuck in C code."""
        if self.watch.preempt_grace <= 0:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        try:
            self.previous_wakeup_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_end)
            os.close(write_end)
            return
        self.signal_pipe = (read_end, write_end)

    # --- one look ----------------------------------------------------------------------------------

    def tick(self) -> None:
        world = self.world()
        if world is not None:
            self.look_at_peers(world)
        if self.stopping_at is not None:
            # Each rank on its own, without the ranks' store: rank 0 (its host) may have ended already.
            idle = time.monotonic() - max(self.stopping_at, HEARTBEAT.at)
            if idle > self.watch.preempt_grace:
                self.end(
                    "stop",
                    f"SIGTERM: the run stopped at global step {self.stopping_step} but did not end within "
                    f"preempt_grace={self.watch.preempt_grace:g} s; stacks of every thread: "
                    f"{self.watch.run_dir / f'stacks-rank{self.rank}.txt'}",
                )
            # If this thread cannot run (a stuck call that holds the GIL), faulthandler's own thread
            # prints every stack and ends the process: pushed back at every look while this one runs.
            with self.lock:
                if not self.stopped:
                    faulthandler.dump_traceback_later(self.watch.preempt_grace + _END_WITHIN_S, exit=True)
            return
        state, stalled_for = HEARTBEAT.state, time.monotonic() - HEARTBEAT.at
        hang_timeout = self.watch.hang_timeout
        stalled = hang_timeout > 0 and stalled_for > heartbeat.allowance(state, hang_timeout)
        self.publish(heartbeat.record(stalled=stalled, stalled_for=round(stalled_for, 1)), world)
        end = world._get("hang/end") if world is not None else None
        if end is not None:
            self.end(end["kind"], end["cause"])
        self.look_for_preemption()
        preempted_for = time.monotonic() - (self.preempted_at or time.monotonic())
        if preempted_for > self.watch.preempt_grace and not self.watch.boundary_reached:
            self.decide("preempt", world)
        if stalled and self.every_rank_stalled(world):
            self.decide("hang", world)

    def look_at_peers(self, world: failures.World) -> None:
        """End this rank ``GRACE_S`` after a peer on this machine died, if no collective did by then."""
        ended = world.look_at_peers()
        if not ended:
            return
        rank = min(ended)
        if self.peer_lost_at is None:
            self.peer_lost_at = time.monotonic()
            log.warning(
                "rank %d%s %s; this rank stops at its next collective", rank, world._where(rank), ended[rank]
            )
        elif time.monotonic() - self.peer_lost_at > failures.GRACE_S:
            cause = world.peer_cause(wait_s=0) or "another rank ended"
            self.end(
                "peer", f"{cause}; rank {self.rank} waited {failures.GRACE_S} s in no collective with it"
            )

    # --- what the ranks tell each other ------------------------------------------------------------

    def world(self) -> failures.World | None:
        world = failures.current_world()
        return world if world is not None and world.running and world.trainer is self.trainer else None

    def publish(self, record: dict[str, Any], world: failures.World | None) -> None:
        """This rank's heartbeat record, for people (the run folder) and the other ranks (the store)."""
        with self.lock, contextlib.suppress(OSError):  # the file is for people looking at a running job
            if not self.stopped:  # stop() removed it: a run that went on leaves no stale one behind
                (self.watch.run_dir / f"heartbeat-rank{self.rank}.json").write_text(json.dumps(record))
        polled = {self.rank: record}
        if world is not None:
            world._set(f"beat/{self.rank}", record)
            found = {rank: world._get(f"beat/{rank}") for rank in range(world.size) if rank != self.rank}
            polled.update({rank: peer for rank, peer in found.items() if peer})
            world.peers = {**world.peers, **polled}  # a new dict, as other threads may be reading the old one
        self.polled = polled

    def every_rank_stalled(self, world: failures.World | None) -> bool:
        if world is None:
            return True
        silent_after = _SILENT_AFTER_POLLS * self.poll + 5
        for rank in range(world.size):
            record = self.polled.get(rank, {})
            if "stalled" not in record:
                return False  # not watching yet, hang detection off there, or its record unread now
            if not record["stalled"] and time.time() - record["heartbeat"] < silent_after:
                return False
        return True

    def look_for_preemption(self) -> None:
        if self.preempted_at is not None or self.watch.preempt_grace <= 0:
            return
        received = b""
        with self.lock, contextlib.suppress(BlockingIOError, OSError):
            if self.signal_pipe is not None:
                received = os.read(self.signal_pipe[0], 512)
        # Only the ranks that got the signal count the grace: the first past it claims the end for all.
        if any(number in received for number in self.watch.signals):
            self.preempted_at = time.monotonic()

    # --- the end -----------------------------------------------------------------------------------

    def decide(self, kind: str, world: failures.World | None) -> None:
        """Claim the run's end (one rank says why), or follow the rank that claimed it."""
        if world is not None:
            try:
                claimed = world.store.add(f"{world.prefix}/hang/claim", 1) == 1
            except Exception:
                claimed = True  # the store is gone with rank 0: say it from here
            if not claimed:
                return  # the claimant's record comes at a next tick
        cause = self.cause(kind, world)
        if world is not None:
            world._set("hang/end", {"kind": kind, "cause": cause})
        self.end(kind, cause)

    def cause(self, kind: str, world: failures.World | None) -> str:
        """Why the run ends, for a hang or a preemption, naming the rank the others wait for."""
        records = world.peers if world is not None else self.polled
        rank = min(records, key=lambda r: (*heartbeat.order(_state(records[r])), r))
        where = heartbeat.describe(_state(records[rank]))
        if kind == "hang":
            who = f"rank {rank}" if world is not None else "the run"
            stacks = self.watch.run_dir / ("stacks-rank*.txt" if world is not None else "stacks-rank0.txt")
            return (
                f"{who} made no progress for {records[rank].get('stalled_for', 0.0):.0f} s in {where} "
                f"(hang_timeout={self.watch.hang_timeout:g} s); stacks of every thread: {stacks}"
            )
        who = f"rank {rank} is" if world is not None else "it is"
        return (
            f"SIGTERM: the ranks did not reach a common batch boundary within "
            f"preempt_grace={self.watch.preempt_grace:g} s ({who} in {where}); "
            f"stacks of every thread: {self.watch.run_dir / 'stacks-rank*.txt'}"
        )

    def end(self, kind: str, cause: str) -> None:
        """Stacks, summary.json (rank 0), the line, and the end of this process and its children."""
        if not self.ending.acquire(blocking=False):
            while True:  # another thread of this process is ending it
                time.sleep(1)
        heartbeat.unwatch("rank", self.tick)
        faulthandler.dump_traceback_later(_END_WITHIN_S, exit=True)  # whatever blocks below
        world = failures.current_world()
        if world is not None:
            world.running = False  # peers that end now are not reported
        self.dump_stacks(world)
        if kind in ("hang", "peer"):  # a failure: what it leaves to resume from
            reason = f"{cause}; every rank stopped; {failures.kept(self.trainer)}"
            status, code = "failed", EXIT_FAILED
        else:  # "preempt" or "stop" (stuck on the way out: preempted.ckpt is the newest once written)
            written = "no preempted checkpoint was written; " if kind == "preempt" else ""
            reason = f"{cause}; {written}the next attempt resumes from {self.resume_point()}"
            status, code = "interrupted", EXIT_PREEMPTED
        log.error(reason)
        if self.trainer.is_global_zero:
            record = functools.partial(self.watch.record_failure, self.trainer, status=status, error=reason)
            writer = threading.Thread(target=record, daemon=True)
            writer.start()
            writer.join(_SUMMARY_WAIT_S)  # the local copy is written first; a stalled storage's may not be
            if writer.is_alive():
                log.warning("summary.json: the storage's copy was not written in %d s", _SUMMARY_WAIT_S)
        if world is not None:
            world.wait_for_children()  # they end by themselves at their next tick; killed at the deadline
        for child in psutil.Process().children(recursive=True):  # DataLoader workers, py-spy
            with contextlib.suppress(psutil.Error):
                child.kill()
        sys.stderr.write(error_line(reason) + "\n")
        sys.stderr.flush()
        os._exit(code)

    def resume_point(self) -> str:
        if not self.trainer.is_global_zero:
            return "the newest checkpoint rank 0 wrote"
        newest = newest_checkpoint(self.trainer)
        if newest is not None:
            return f"{newest[0]} (step {newest[1]})"
        started_from = self.watch.run.resume_from
        if started_from:
            return f"{started_from}, the checkpoint this attempt started from"
        return "the start: no checkpoint was written yet"

    def dump_stacks(self, world: failures.World | None = None) -> None:
        """Every thread's Python stack (faulthandler), then with py-spy (where installed) the native
        ones and those of this rank's child processes (DataLoader workers: one may be the stuck part)."""
        path = self.watch.run_dir / f"stacks-rank{self.rank}.txt"
        ranks = set()  # processes of other ranks (Lightning's launcher starts them here): they dump their own
        if world is not None:
            ranks = {peer["pid"] for peer in world.peers.values()} | {c.pid for c in world.children.values()}
        children = [c.pid for c in psutil.Process().children() if c.pid not in ranks]
        py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        deadline = time.monotonic() + _PY_SPY_S
        pids = ", ".join(map(str, children))
        missing = f"; the stacks of its child processes ({pids}) are missing too" if children else ""
        where = heartbeat.describe(HEARTBEAT.state)
        try:
            with open(path, "w") as file:
                file.write(f"rank {self.rank} (pid {os.getpid()}), in {where}\n\n")
                file.flush()
                faulthandler.dump_traceback(file=file, all_threads=True)
                if py_spy is None:
                    file.write(f"\nno native stacks: py-spy is not installed (pip install py-spy){missing}\n")
                    return
                for pid, native in [(os.getpid(), ["--native"]), *((pid, []) for pid in children)]:
                    file.write(f"\npy-spy dump {' '.join(native)} --pid {pid}:\n")
                    file.flush()
                    timeout = max(1.0, deadline - time.monotonic())
                    with contextlib.suppress(OSError, subprocess.SubprocessError):
                        command = [py_spy, "dump", *native, "--pid", str(pid)]
                        subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, timeout=timeout)
        except OSError as error:
            log.warning("hangs: stacks not written to %s: %s", path, error)


_current: Watchdog | None = None  # this process's newest
_handlers_before_fit: dict[int, Any] = {}  # what RankWatch's signal handlers stand in for


def restore_signal_handlers() -> None:
    """Puts back the signal handlers of before the fit."""
    if threading.current_thread() is threading.main_thread():
        for signum, handler in _handlers_before_fit.items():
            signal.signal(signum, handler)
    _handlers_before_fit.clear()


def stop_watching() -> None:
    """Called once the outcome of a run stopped by a SIGTERM is recorded: its watch ends and the
    handlers of before the fit are back, so a process that goes on (a notebook) is not ended later."""
    restore_signal_handlers()
    watchdog = _current
    if watchdog is not None and watchdog.stopping_at is not None:
        watchdog.stop()
        faulthandler.cancel_dump_traceback_later()


def follow_an_ending_run() -> None:
    """Called where a rank's own failure is about to end it (a collective failed because a peer
    ended): if the ranks are ending a hang or a preemption, this rank ends as they do, with their line."""
    watchdog = _current
    if watchdog is None:
        return
    if watchdog.ending.locked():
        while True:  # the watchdog's thread is ending this process
            time.sleep(1)
    world = failures.current_world()
    end = world._get("hang/end") if world is not None and world.trainer is watchdog.trainer else None
    if end is not None:
        watchdog.end(end["kind"], end["cause"])


def _state(record: dict[str, Any]) -> heartbeat.State:
    fields = heartbeat.State.__dataclass_fields__
    return heartbeat.State(**{name: record[name] for name in fields if name in record})


def _epoch_ending(trainer: L.Trainer) -> bool:
    """Whether fitting is in an epoch's last batch or in a validation. Stopped there, Lightning would
    cut the validation short, and a resume would go straight on without it (it resumes a checkpoint
    of an epoch's last batch into the next epoch): such a stop waits for the epoch's end."""
    return in_an_epochs_last_batch(trainer) or trainer.validating or trainer.sanity_checking


def _requeue_this_job() -> None:
    job = heartbeat.slurm_job_id()
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode == 0:
        log.warning("requeued Slurm job %s: it resumes from preempted.ckpt when it starts again", job)
    else:
        log.error("scontrol requeue %s failed: %s", job, result.stderr.strip())
