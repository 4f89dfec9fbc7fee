"""Where this rank is in its run (``HEARTBEAT``), for the hang detector (``litlab.run.hangs``).

The loop's hooks and the checkpoint writer only set attributes (no I/O, no lock), and the detector's
thread reads them; ranks run the same hooks in order, so the rank with the fewest beats is the one the
others wait for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

# The phases a stuck rank is named by.
STARTING = "starting"  # from setup to the first batch: strategy setup, restoring a checkpoint
TRAINING = "training step"
VALIDATION = "validation"
CHECKPOINT = "checkpoint write"
DATA = "waiting for data"  # from the end of a batch's hooks to the next batch's arrival
TESTING = "testing"

FIRST_ALLOWANCE = 3  # times hang_timeout for a first step or validation: compiling, cudnn benchmarks
UPLOAD_BYTES_PER_S = 10 * 2**20  # an object-store upload's allowance grows with its size at this rate


@dataclass(frozen=True)
class State:
    """One rank's position: replaced whole by every beat, so a reader never sees half of one."""

    phase: str = STARTING
    step: int = 0  # the global step in progress (training) or reached (the others)
    beats: int = 0
    first: bool = True  # a first step or validation since the process started fitting
    bytes_written: int = 0  # of the checkpoint being written
    upload_bytes: int = 0  # of an upload that reports no progress of its own (one object-store PUT)


class Heartbeat:
    def __init__(self) -> None:
        self.state = State()
        self.at = time.monotonic()  # of the last progress
        self.preempt_boundary_reached = False

    def reset(self) -> None:
        self.state, self.at, self.preempt_boundary_reached = State(), time.monotonic(), False

    def beat(self, phase: str, step: int, first: bool = False) -> None:
        self.state = State(phase, step, self.state.beats + 1, first)
        self.at = time.monotonic()

    def wrote(self, nbytes: int) -> None:
        """Progress of a checkpoint write, in bytes: a large checkpoint is slow, not stuck."""
        state = self.state
        self.state = State(state.phase, state.step, state.beats, state.first, state.bytes_written + nbytes)
        self.at = time.monotonic()

    def uploading(self, nbytes: int) -> None:
        state = self.state
        self.state = State(state.phase, state.step, state.beats, state.first, state.bytes_written, nbytes)
        self.at = time.monotonic()

    @contextlib.contextmanager
    def writing_checkpoint(self, step: int) -> Iterator[None]:
        """The block writes the checkpoint of global step ``step``; afterwards the rank is where it was
        before (not counted as a beat: only the ranks that write checkpoints get here)."""
        before = self.state
        self.state = State(CHECKPOINT, step, before.beats, before.first)
        self.at = time.monotonic()
        try:
            yield
        finally:
            self.state, self.at = before, time.monotonic()


HEARTBEAT = Heartbeat()  # this process's: one rank per process


def describe(state: State) -> str:
    """The phase in words, as the stuck rank's line names it."""
    if state.phase == TRAINING:
        return f"training step {state.step}"
    if state.phase == DATA:
        return f"waiting for data (before training step {state.step})"
    if state.phase == CHECKPOINT:
        written = f", {_size(state.bytes_written)} written" if state.bytes_written else ""
        uploading = f", uploading {_size(state.upload_bytes)}" if state.upload_bytes else ""
        return f"checkpoint write at global step {state.step}{written}{uploading}"
    if state.phase == VALIDATION:
        return f"validation at global step {state.step}"
    if state.phase == STARTING:
        return f"starting (before training step {state.step}: setup, checkpoint restore, first batch)"
    return f"{state.phase} after global step {state.step}"


def allowance(state: State, hang_timeout: float) -> float:
    """Seconds without progress after which this rank counts as stalled: ``hang_timeout``, times
    ``FIRST_ALLOWANCE`` for a first step or validation (and the start), plus the time an upload of
    its size takes at ``UPLOAD_BYTES_PER_S``."""
    factor = FIRST_ALLOWANCE if state.first or state.phase == STARTING else 1
    return hang_timeout * factor + state.upload_bytes / UPLOAD_BYTES_PER_S


def order(state: State) -> tuple[int, int]:
    """Sort key of the ranks' states: the first is the rank the others wait for (fewest beats; at a
    tie, the one writing a checkpoint or waiting for data: the others wait at the next collective)."""
    busy = state.phase in (CHECKPOINT, DATA)
    return (state.beats, 0 if busy else 1)


class CountingWriter:
    """A file object that reports every write's bytes to the heartbeat (torch.save writes through it)."""

    def __init__(self, file: IO[bytes], heartbeat: Heartbeat = HEARTBEAT) -> None:
        self.file, self.heartbeat = file, heartbeat

    def write(self, data: Any) -> int:
        written = self.file.write(data)
        self.heartbeat.wrote(len(data) if written is None else written)
        return written

    def __getattr__(self, name: str) -> Any:  # flush, fileno, tell, seek... of the wrapped file
        return getattr(self.file, name)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} bytes"
