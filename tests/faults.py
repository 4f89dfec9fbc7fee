"""Networks, datamodules and a callback for tests that fail on purpose or report on the process
training them: picked with ``model=mlp model.net._target_=tests.faults.X`` (networks),
``data._target_=tests.faults.X`` or ``+callbacks.NAME._target_=tests.faults.X`` (callbacks).

The test process puts the repository on PYTHONPATH so that training subprocesses can import them.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from litlab.logs import global_rank
from project.vision.data import DigitsDataModule
from project.vision.module import ImageClassifier
from project.vision.nets import MLP


class ClassifierWithoutPredictStep(ImageClassifier):
    """An ImageClassifier without predict_step: Lightning's default passes forward its whole batch."""

    predict_step = L.LightningModule.predict_step


class MLPOutOfMemoryAbove32(MLP):
    """An MLP that raises CUDA's out-of-memory error for batches of more than 32 samples, as a GPU
    with room for 32 would, on any device."""

    max_batch = 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_batch:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by tests.faults: batch "
                f"{x.shape[0]} > {self.max_batch})"
            )
        return super().forward(x)


class MLPReportingItsProcess(MLP):
    """An MLP that, at its first training forward pass, writes to $LITLAB_TEST_REPORT what the
    training process looks like then: objects hidden from the garbage collector, and how CUDA is checked."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        report = os.environ.get("LITLAB_TEST_REPORT")
        if self.training and report and not os.path.exists(report):
            state = {
                "frozen_objects": gc.get_freeze_count(),
                "nvml_based_cuda_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            }
            with open(report, "w") as file:
                json.dump(state, file)
        return super().forward(x)


class MLPReportingItsRank(MLP):
    """An MLP that, at its first training forward pass, writes ``$LITLAB_TEST_REPORT.rank<N>.json``:
    the process's pid, its parent's, and the global rank submitit gave it (None: not a submitit task),
    so a test can tell ranks a cluster started from ranks that Lightning launched."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        report = os.environ.get("LITLAB_TEST_REPORT")
        path = f"{report}.rank{global_rank()}.json"
        if self.training and report and not os.path.exists(path):
            state = {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "submitit": os.environ.get("SUBMITIT_LOCAL_GLOBALID"),
            }
            with open(path, "w") as file:
                json.dump(state, file)
        return super().forward(x)


class DigitsInALeftoverProcessGroup(DigitsDataModule):
    """The digits, built in a process that already holds a one-member process group, as an earlier
    in-process DDP job used to leave one: Lightning then adopts it whatever the run's world size.
    (A datamodule, not a network: litlab builds it before fit; the network is built inside fit.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import socket

        if not torch.distributed.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            url = f"tcp://127.0.0.1:{port}"
            torch.distributed.init_process_group("gloo", init_method=url, rank=0, world_size=1)


class DigitsFromAService(DigitsDataModule):
    """The digits, as if fetched from a service that needs a token: it takes the token and a header
    built from it (``${oc.env:...}`` in the config), records them with ``save_hyperparameters`` (which
    Lightning logs to every logger and stores in checkpoints), and fails unless it got the real values
    from ``SERVICE_TOKEN_ENV``: what is written is redacted, what runs is not."""

    def __init__(self, *args, service_token: str, service_header: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        real = os.environ[SERVICE_TOKEN_ENV]
        if (service_token, service_header) != (real, f"Bearer-{real}"):
            raise ValueError(f"built with a redacted token: {service_token!r}, {service_header!r}")
        self.save_hyperparameters()


SERVICE_TOKEN_ENV = "LITLAB_TEST_SERVICE_TOKEN"


class DigitsServedSlowly(DigitsDataModule):
    """The digits with a train loader that takes 100 ms to hand out each batch, as a slow disk or an
    image decoder on too few workers would: an input-bound run."""

    delay_s = 0.1

    def train_dataloader(self):
        return _SlowBatches(super().train_dataloader(), self.delay_s)


class _SlowBatches:
    """A train loader that waits before each batch of the loader it wraps (and resumes as it does)."""

    def __init__(self, loader, delay_s: float) -> None:
        self.loader, self.delay_s = loader, delay_s
        self.sampler, self.batch_sampler = loader.sampler, loader.batch_sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            time.sleep(self.delay_s)
            yield batch

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state) -> None:
        self.loader.load_state_dict(state)


class MLPThatWarns(MLP):
    """An MLP whose first training forward pass warns, as a user's own code may: litlab must let
    such warnings through while it drops the known third-party ones."""

    message = "tests.faults: a warning from the user's own code"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not getattr(self, "_warned", False):
            self._warned = True
            warnings.warn(self.message, UserWarning, stacklevel=2)
        return super().forward(x)


class DigitsOnAPlainDataLoader(DigitsDataModule):
    """The digits served by a plain torch DataLoader, which cannot restore its position."""

    def train_dataloader(self):
        images, labels = self.splits["train"]
        dataset = torch.utils.data.TensorDataset(images, labels)
        return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, shuffle=True)


class MLPFailingOnOneRank(MLP):
    """An MLP that fails on purpose in one rank's training forward pass, as $LITLAB_TEST_FAULT says:
    ``<kind>@<rank>:<call>`` with kind ``kill`` (SIGKILL itself), ``raise`` (a RuntimeError) or ``oom``
    (CUDA's out-of-memory error), on global rank ``rank`` (``*``: every rank), at its ``call``-th
    training forward pass, counted from 1 in this process. Without the variable, the plain MLP."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fault = os.environ.get("LITLAB_TEST_FAULT")
        if self.training and fault:
            self._calls += 1
            kind, where = fault.split("@")
            rank, call = where.split(":")
            if rank in ("*", str(global_rank())) and self._calls == int(call):
                if kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if kind == "oom":
                    raise torch.cuda.OutOfMemoryError(
                        "CUDA out of memory. Tried to allocate 2.00 GiB (injected)"
                    )
                raise RuntimeError(f"injected failure on rank {global_rank()}")
        return super().forward(x)


class ClassifierWithANanLossOnOneRank(ImageClassifier):
    """The image classifier whose training loss is nan on one rank at one step, as
    $LITLAB_TEST_NAN_AT says (``<rank>:<global step>``), while every gradient stays finite (the nan
    is added to the loss, not through the graph): only that rank can see it, so the ranks skip or
    stop together only if they decide together. Writes each rank's final weights to
    ``$LITLAB_TEST_REPORT.rank<N>.pt``."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        rank, step = (int(v) for v in os.environ["LITLAB_TEST_NAN_AT"].split(":"))
        if global_rank() == rank and self.global_step == step:
            return loss + torch.tensor(float("nan"), device=loss.device)
        return loss

    def on_train_end(self) -> None:
        torch.save(self.state_dict(), f"{os.environ['LITLAB_TEST_REPORT']}.rank{global_rank()}.pt")


class MeetAtTrainStart(Callback):
    """Waits at the start of training until ``n`` runs have arrived, as $LITLAB_TEST_MEET says
    (``<folder>:<n>``): each leaves a file in the folder. Runs that do not run at the same time never
    all arrive, and the first one fails after ``MEET_S``: how a test tells that jobs overlapped
    without comparing times."""

    def __init__(self, runs: int | None = None) -> None:
        self.runs = runs  # wait for this many instead of $LITLAB_TEST_MEET's n

    def on_train_start(self, trainer, pl_module) -> None:
        folder, n = os.environ["LITLAB_TEST_MEET"].rsplit(":", 1)
        n = self.runs or int(n)
        # What the process was given to run on, for tests of where a launcher put it.
        given = {"cpus": sorted(os.sched_getaffinity(0)), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
        with open(os.path.join(folder, str(os.getpid())), "w") as file:
            file.write(json.dumps({**given, "threads": torch.get_num_threads(), "argv": sys.argv}))
        deadline = time.monotonic() + MEET_S
        while len(os.listdir(folder)) < int(n):
            if time.monotonic() > deadline:
                raise RuntimeError(f"tests.faults: {len(os.listdir(folder))} of {n} runs met in {MEET_S} s")
            time.sleep(0.05)


MEET_S = 120


# --- exact stopping points for resume tests ------------------------------------------------------

SIGNAL_AT_ENV = "LITLAB_TEST_SIGNAL_AT"
# Where SignalAt stops a run, in the order Lightning reaches them within a step (train_batch_end runs
# before the step's checkpoint: Lightning calls checkpoint callbacks last).
PHASES = ("train_batch_start", "train_batch_end", "validation", "checkpoint_write")


class SignalAt(Callback):
    """A callback that signals its own process at one exact point of training, as $LITLAB_TEST_SIGNAL_AT
    says: ``<SIGNAL>:<phase>:<global step>``, e.g. ``SIGKILL:train_batch_end:5``. Phases:

    - ``train_batch_start``: before the batch of that global step runs (after the previous step and
      its checkpoint);
    - ``train_batch_end``: after that step's optimizer update, before its checkpoint is written;
    - ``validation``: after the first validation batch at that global step (not the sanity check);
    - ``checkpoint_write``: while the first checkpoint at that step is being written: half of its
      bytes are in the file, flushed to disk, when the signal is sent (SIGKILL: as a kill mid-write).

    Every checkpoint also records the process's random generators' states (``tests.faults.rng``),
    so tests can compare them with an uninterrupted run's. Without the variable it only records.
    """

    def __init__(self) -> None:
        spec = os.environ.get(SIGNAL_AT_ENV)
        self.signal = self.phase = self.step = None
        if spec:
            name, self.phase, step = spec.split(":")
            self.signal, self.step = signal.Signals[name], int(step)
            if self.phase not in PHASES:
                raise ValueError(f"{SIGNAL_AT_ENV}={spec}: the phase is one of {', '.join(PHASES)}")
            if self.phase == "checkpoint_write" and self.signal != signal.SIGKILL:
                raise ValueError(f"{SIGNAL_AT_ENV}={spec}: a write is stopped by SIGKILL only")

    def _at(self, phase: str, trainer) -> bool:
        return self.phase == phase and trainer.global_step == self.step and not trainer.sanity_checking

    def _send(self) -> None:
        self.phase = None  # once
        os.kill(os.getpid(), self.signal)

    def on_train_batch_start(self, trainer, *args) -> None:
        if self._at("train_batch_start", trainer):
            self._send()

    def on_train_batch_end(self, trainer, *args) -> None:
        if self._at("train_batch_end", trainer):
            self._send()

    def on_validation_batch_end(self, trainer, *args) -> None:
        if self._at("validation", trainer):
            self._send()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["tests.faults"] = {"rng": random_generator_states()}
        if self._at("checkpoint_write", trainer):
            self.phase = None
            torch.save = _half_written_then_signalled(torch.save, self.signal)


HOLD_AT_ENV = "LITLAB_TEST_HOLD_AT"
HOLD_S = 120  # at most: a signal that never comes fails the test by its own timeout, not by a hang


class HoldAt(Callback):
    """A callback that holds training after one exact step until its process receives a signal, as
    $LITLAB_TEST_HOLD_AT says: ``<SIGNAL>:<global step>``, e.g. ``SIGUSR1:5``. For signals sent from
    outside (``scancel --signal``, a launcher): a tiny run would otherwise finish before they arrive.
    It prints ``tests.faults: holding at step N until SIGNAL`` when it starts waiting; the handlers
    already installed for the signal (Lightning's, litlab's) still run, once, when it comes."""

    def __init__(self) -> None:
        spec = os.environ.get(HOLD_AT_ENV)
        self.signal = self.step = None
        if spec:
            name, step = spec.split(":")
            self.signal, self.step = signal.Signals[name], int(step)

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.step is None or trainer.global_step != self.step:
            return
        self.step = None  # once
        step = trainer.global_step
        hold_until_signal(
            self.signal,
            announce=lambda: print(
                f"tests.faults: holding at step {step} until {self.signal.name}", flush=True
            ),
        )


def hold_until_signal(
    signum: int, announce: Callable[[], None], holding: Callable[[], bool] = lambda: True
) -> None:
    """Sleep until the process receives ``signum``, ``holding()`` turns false or ``HOLD_S`` pass. The
    handler already installed for the signal (Lightning's, litlab's) still runs, once, when it comes;
    ``announce`` tells the test that the hold began, after the signal is caught."""
    received = []
    handler = signal.getsignal(signum)

    def note(signum, frame) -> None:
        received.append(signum)
        if callable(handler):
            handler(signum, frame)

    signal.signal(signum, note)
    announce()
    deadline = time.monotonic() + HOLD_S
    try:
        while holding() and not received and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs between these sleeps
    finally:
        signal.signal(signum, handler)


def random_generator_states() -> dict[str, torch.Tensor]:
    """torch's, Python's and numpy's global generator states, as tensors (weights_only loads them)."""
    import random

    import numpy as np

    _, python_state, _ = random.getstate()
    _, numpy_keys, numpy_position, *_ = np.random.get_state()
    return {
        "torch": torch.random.get_rng_state(),
        "python": torch.tensor(python_state, dtype=torch.int64),
        "numpy": torch.tensor([*numpy_keys.tolist(), numpy_position], dtype=torch.int64),
    }


def _half_written_then_signalled(save, sig: signal.Signals):
    """A torch.save that serializes for real, writes the first half of the bytes where it was asked
    to, flushes them to disk and sends ``sig`` to its own process (for SIGKILL: it never returns)."""

    def save_half(obj, f, *args, **kwargs) -> None:
        buffer = io.BytesIO()
        save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        with contextlib.ExitStack() as stack:
            file = f if hasattr(f, "write") else stack.enter_context(open(f, "wb"))  # noqa: SIM115
            file.write(data[: len(data) // 2])
            file.flush()
            if hasattr(file, "fileno"):
                os.fsync(file.fileno())
            os.kill(os.getpid(), sig)

    return save_half


# --- ranks that stop making progress (tests/integration/test_hangs.py) ---------------------------

SLEEP_AT_ENV = "LITLAB_TEST_SLEEP_AT"
SLEEP_S = 300  # at most: longer than any hang test waits, shorter than a forgotten process lives


def sleep_while_parent_lives(seconds: float) -> None:
    """Sleep, as a stuck process does, but end with the process that started this one (a DataLoader
    worker whose rank was ended must not outlive it by minutes)."""
    parent = os.getppid()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.2)


class SleepAt(Callback):
    """A callback that stops one rank at one exact point, as a deadlock, an NFS stall or a stuck
    library call would, as $LITLAB_TEST_SLEEP_AT says: ``<rank>:<hook>:<global step>`` with hook
    ``train_batch_start`` (before the step's collectives: the other ranks wait in them) or
    ``train_batch_end`` (after them: the others wait in the next step's), the step numbered by the
    global step at its start. It prints
    ``tests.faults: rank R sleeping in HOOK at step N`` and sleeps ``SLEEP_S``."""

    def __init__(self) -> None:
        spec = os.environ.get(SLEEP_AT_ENV)
        self.rank = self.hook = self.step = None
        if spec:
            rank, self.hook, step = spec.split(":")
            self.rank, self.step = int(rank), int(step)

    def _maybe_sleep(self, hook: str) -> None:
        if hook == self.hook and self.training_step == self.step and global_rank() == self.rank:
            self.hook = None  # once
            print(f"tests.faults: rank {self.rank} sleeping in {hook} at step {self.step}", flush=True)
            time.sleep(SLEEP_S)

    def on_train_batch_start(self, trainer, *args) -> None:
        self.training_step = trainer.global_step  # the step's number: global_step at its start
        self._maybe_sleep("train_batch_start")

    def on_train_batch_end(self, trainer, *args) -> None:
        self._maybe_sleep("train_batch_end")


STUCK_WORKER_ENV = "LITLAB_TEST_STUCK_WORKER"


class DigitsWithAStuckWorker(DigitsDataModule):
    """The digits served by a DataLoader with one worker process that stops yielding on one rank,
    as $LITLAB_TEST_STUCK_WORKER says: ``<rank>:<batch>``: the worker never returns that batch (counted
    from 0 in the epoch)."""

    def train_dataloader(self):
        images, labels = self.splits["train"]
        rank, batch = (int(v) for v in os.environ[STUCK_WORKER_ENV].split(":"))
        stall_at = batch * self.batch_size if global_rank() == rank else None
        return torch.utils.data.DataLoader(
            _StallingDataset(images, labels, stall_at), batch_size=self.batch_size, num_workers=1
        )


class _StallingDataset(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, stall_at: int | None) -> None:
        self.images, self.labels, self.stall_at = images, labels, stall_at
        self.served = 0  # in the worker process: its own copy

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.served == self.stall_at:
            sleep_while_parent_lives(SLEEP_S)
        self.served += 1
        return self.images[index], self.labels[index]


SIGSTOP_AT_ENV = "LITLAB_TEST_SIGSTOP_AT"


class StopProcessAt(Callback):
    """A callback that stops another process (SIGSTOP) at the end of one global step, before that
    step's checkpoint is written, as $LITLAB_TEST_SIGSTOP_AT says: ``<pid>:<global step>`` (rank 0
    only). With the pid of the S3 server, the checkpoint write that follows stalls: its connections
    hang instead of failing. The test sends SIGCONT. Without the variable it does nothing."""

    def on_train_batch_end(self, trainer, *args) -> None:
        if SIGSTOP_AT_ENV not in os.environ:
            return
        pid, step = (int(v) for v in os.environ[SIGSTOP_AT_ENV].split(":"))
        if trainer.global_step == step and global_rank() == 0:
            print(f"tests.faults: SIGSTOP to {pid} at step {step}", flush=True)
            os.kill(pid, signal.SIGSTOP)


class PhaseSpy(Callback):
    """Records what the hang detector's heartbeat says at your callbacks' hooks, in ``PHASES_SEEN``
    (in-process tests read it): (hook, phase in words, first-step allowance)."""

    def _note(self, hook: str) -> None:
        from litlab.heartbeat import HEARTBEAT, describe

        PHASES_SEEN.append((hook, describe(HEARTBEAT.state), HEARTBEAT.state.first))

    def on_train_batch_start(self, trainer, *args) -> None:
        self._note("train_batch_start")

    def on_train_batch_end(self, trainer, *args) -> None:
        self._note("train_batch_end")

    def on_validation_batch_start(self, trainer, *args) -> None:
        self._note("validation_batch_start")


PHASES_SEEN: list[tuple[str, str, bool]] = []


HOLD_FILE_ENV = "LITLAB_TEST_HOLD_FILE"


class HoldWhileFileExists(Callback):
    """Holds training after its first optimizer step for as long as the file $LITLAB_TEST_HOLD_FILE
    exists (at most ``HOLD_S``), after writing ``<file>.held``: a test creates the file for the one
    run it wants to catch mid-training (runs that start without it go on), waits for ``.held``, then
    kills what it kills. A SIGTERM ends the hold: the run then stops as Lightning and litlab stop it."""

    def on_train_batch_end(self, trainer, *args) -> None:
        path = os.environ.get(HOLD_FILE_ENV)
        if not path or trainer.global_step != 1 or not os.path.exists(path):
            return
        hold_until_signal(
            signal.SIGTERM,
            announce=lambda: Path(f"{path}.held").write_text(str(os.getpid())),
            holding=lambda: os.path.exists(path),
        )


class BlockWhileStopping(Callback):
    """Blocks in ``on_exception`` once Lightning stops fitting for a SIGTERM, after litlab's callbacks
    wrote preempted.ckpt (they run before yours), as a call into a store whose host is gone does: the
    run must end all the same. Prints ``tests.faults: blocking while stopping`` first. ``HOLD_S`` at
    most: where nothing ends the run, the test fails by its assertions, not by a hang."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException):
            print("tests.faults: blocking while stopping", flush=True)
            time.sleep(HOLD_S)


class SigtermAgainWhileStopping(Callback):
    """Once Lightning stops fitting for a SIGTERM, sends this process another SIGTERM right after
    Lightning's teardown put back the signal handlers of before the fit (summary.json is still to
    be written), as a dying sweep's threads do, each through ``PR_SET_PDEATHSIG``. Prints
    ``tests.faults: SIGTERM again`` first."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        import threading

        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exception, SIGTERMException):
            return
        connector = trainer._signal_connector

        def again() -> None:
            deadline = time.monotonic() + HOLD_S
            while connector._original_handlers and time.monotonic() < deadline:  # emptied by its teardown
                time.sleep(0.001)
            print("tests.faults: SIGTERM again", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=again, daemon=True).start()
