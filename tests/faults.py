"""Networks for tests that fail on purpose or report on the process training them: picked with
``model=mlp model.net._target_=tests.faults.X`` (networks) or ``data._target_=tests.faults.X``.

The test process puts the repository on PYTHONPATH so that training subprocesses can import them.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
import warnings

import torch

from litlab.logs import global_rank
from project.vision.data import DigitsDataModule
from project.vision.nets import MLP


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
