"""How failures are put into one line: storage errors (a full disk, an endpoint that does not answer),
a ``strategy=ddp_notebook`` rank's error, a lost peer; and the bound on S3 retries the docs state."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import fsspec
import pytest
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from litlab.errors import describe_exit, forked_rank_failure
from litlab.run.failures import lost_a_peer
from litlab.storage.roots import (
    StorageFailed,
    failed_storage,
    storage_cause,
    storage_options,
    use_storage_options,
    writing,
)


def test_a_full_disk_under_torch_save_is_named_with_its_errno(tmp_path):
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:  # what torch.save raises on a full disk, with the file's OSError as its context
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as error:
        assert storage_cause(error, str(tmp_path)) == "no space left on device (errno ENOSPC)"


def test_an_error_that_is_not_the_storage_s_passes_through(tmp_path):
    with (
        pytest.raises(TypeError, match="cannot pickle"),
        writing(str(tmp_path / "run"), "checkpoints/last.ckpt"),
    ):
        raise TypeError("cannot pickle 'generator' object")
    assert failed_storage(str(tmp_path / "run")) is None


def test_a_failed_write_names_the_storage_and_later_writes_to_it_are_skipped(tmp_path):
    root = str(tmp_path / "failing-run")
    with pytest.raises(StorageFailed) as failed, writing(root, "summary.json"):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), f"{root}/summary.json")
    assert str(failed.value) == (
        f"litlab: error: storage {root} failed while writing summary.json: "
        f"read-only file system ({root}/summary.json)"
    )
    assert failed_storage(f"{root}/checkpoints/last.ckpt") is failed.value
    assert failed_storage(f"{root}-other") is None


def retry_bound_s(timeout: float, attempts: int) -> float:
    """The longest an S3 request can take: every attempt times out, plus botocore's standard mode's
    backoffs (a random wait below min(2 ** (attempt - 1), 20) s)."""
    return attempts * timeout + sum(min(2**attempt, 20) for attempt in range(attempts - 1))


def test_s3_requests_are_bounded_as_the_docs_say():
    # src/litlab/conf/storage/s3.yaml and docs/storage.md: 5 attempts of at most 10 s, backoff <= 1+2+4+8 s.
    assert retry_bound_s(timeout=10, attempts=5) == 65
    options = storage_options({"root": "s3://bucket/prefix", "max_attempts": 5, "timeout_s": 10})
    config = options["config_kwargs"]
    assert config["retries"] == {"mode": "standard", "total_max_attempts": 5}
    assert (config["connect_timeout"], config["read_timeout"]) == (10.0, 10.0)
    # The check before training: one try.
    check = storage_options({"root": "s3://bucket/prefix", "max_attempts": 1, "timeout_s": 2})
    assert check["config_kwargs"]["retries"]["total_max_attempts"] == 1


def test_s3_filesystems_of_a_run_try_each_request_once_at_s3fs_level(monkeypatch):
    s3fs = pytest.importorskip("s3fs")
    monkeypatch.setattr(fsspec.config, "conf", {})
    try:
        use_storage_options("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9"})
        for protocol in ("s3", "s3a"):
            fs = fsspec.filesystem(protocol, skip_instance_cache=True)
            assert isinstance(fs, s3fs.S3FileSystem) and fs.retries == 1
        assert s3fs.S3FileSystem.retries == 5  # s3fs's own class is left as it is
    finally:
        for protocol in ("s3", "s3a"):
            fsspec.register_implementation(protocol, s3fs.S3FileSystem, clobber=True)


def test_a_forked_ddp_notebook_rank_s_error_becomes_one_line_naming_the_rank():
    traceback = (
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "litlab.callbacks.nonfinite.NonFiniteLoss: litlab: error: at global step 1 the loss is nan\n"
    )
    assert (
        forked_rank_failure(ProcessRaisedException(traceback, 1, 123))
        == "rank 1: at global step 1 the loss is nan"
    )
    plain = traceback.replace(
        "litlab.callbacks.nonfinite.NonFiniteLoss: litlab: error:", "builtins.ValueError:"
    )
    assert (
        forked_rank_failure(ProcessRaisedException(plain, 0, 123))
        == "rank 0 failed: ValueError: at global step 1 the loss is nan"
    )
    killed = ProcessExitedException("exited", 1, 123, exit_code=-9, signal_name="SIGKILL")
    assert forked_rank_failure(killed) == "rank 1 was killed by SIGKILL (exit code -9)"
    assert forked_rank_failure(ValueError("x")) is None


def test_a_lost_peer_is_told_from_a_rank_s_own_error():
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:21344"
    )
    assert lost_a_peer(gloo)
    assert not lost_a_peer(RuntimeError("injected failure on rank 1"))
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    assert describe_exit(killed.wait(), guess=False) == "was killed by SIGKILL"
    assert describe_exit(3, guess=False) == "exited with status 3"
    assert describe_exit(-9) == "was killed by SIGKILL (out of memory?)"  # a sweep job's process
