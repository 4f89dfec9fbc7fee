"""``litlab.isolation``: what a job run in the sweep's process changes is put back afterwards.

In-process: the block changes every kind of process-wide state the way a training run can, then
each must be as it was, also when the block raised.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import socket
import warnings

import fsspec
import numpy as np
import pytest
import torch

import litlab.run.build  # noqa: F401  (what importing the engine does belongs to the process, not a job)
from litlab.launch.isolation import process_state_restored, torch_flags


def change_everything() -> None:
    os.environ["PL_GLOBAL_SEED"] = "7"
    os.environ["LOCAL_RANK"] = "0"
    os.environ.pop("HOME", None)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
    torch.set_float32_matmul_precision("medium")
    torch.autograd.set_detect_anomaly(True)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    with socket.socket() as s:  # a free port for a one-member process group, as DDP on one device makes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger("litlab.test.new").addHandler(logging.NullHandler())
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="litlab test filter")
    gc.set_threshold(1, 1, 1)
    gc.freeze()
    fsspec.config.conf.setdefault("s3", {})["client_kwargs"] = {"endpoint_url": "http://127.0.0.1:1"}


@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
def test_every_kind_of_process_state_a_run_changes_is_put_back(raises):
    environ, flags = dict(os.environ), torch_flags()
    rng = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger("lightning.pytorch").level
    filters, threshold, fsspec_conf = list(warnings.filters), gc.get_threshold(), dict(fsspec.config.conf)
    # An earlier in-process run in this test process may have frozen objects (litlab does at fit start).
    gc.unfreeze()

    with pytest.raises(RuntimeError) if raises else contextlib.nullcontext(), process_state_restored():
        change_everything()
        assert torch_flags() != flags  # the block did change them
        if raises:
            raise RuntimeError("the job failed")

    assert dict(os.environ) == environ
    assert torch_flags() == flags
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert np.array_equal(np.random.get_state()[1], rng[1]) and random.getstate() == rng[2]
    assert not torch.distributed.is_initialized()
    assert logging.getLogger().handlers == handlers
    assert logging.getLogger("litlab.test.new").handlers == []
    assert logging.getLogger("lightning.pytorch").level == level
    assert warnings.filters == filters
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0
    assert fsspec.config.conf == fsspec_conf


def test_a_world_differs_when_members_or_optimizer_steps_per_rank_differ():
    from litlab.callbacks.world import world_problem

    assert world_problem(2, 2, [8, 8]) is None
    assert world_problem(1, 1, [8]) is None
    assert "trainer.world_size is 2 (devices x nodes) but its process group had 1 member" in world_problem(
        2, 1, [8]
    )
    assert "had 3 members" in world_problem(2, 3, [8, 8, 8])
    assert "(rank 0: 8, rank 1: 7)" in world_problem(2, 2, [8, 7])
