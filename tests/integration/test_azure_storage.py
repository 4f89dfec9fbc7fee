"""storage=azure against Azurite (tests/azurite_server.py): what is Azure's own. What every object store
must do, a SIGKILLed run resuming and an outage mid-run, is tested once per store (``object_store``)
in test_resume.py and test_storage_faults.py.

Everything here runs in this process except one ``litlab-train`` whose storage check refuses the key
(exit 2 in one line, before torch loads, as the S3 cases of test_storage.py). The account key, the
secret of the connection string, must appear in no line.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time

import pytest

from litlab.config.redact import walk
from litlab.storage.lock import RunLock
from litlab.storage.roots import (
    RunStorage,
    StorageError,
    StorageFailed,
    check_storage,
    storage_options,
    use_storage_options,
    writing,
)
from tests.conftest import run_dirs
from tests.integration.test_storage import fails_in_one_line, litlab_checking_storage


def refused(storage: dict) -> str:
    """The check's one line for ``storage`` (it must refuse)."""
    with pytest.raises(StorageError) as error:
        check_storage(storage)
    return str(error.value)


def test_azure_check_before_training_names_the_cause_and_never_the_key(azure_server, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_server.connection_string)
    container = azure_server.create_bucket("checked")
    for scheme in ("az", "abfs", "abfss"):
        check_storage({"name": "azure", "root": f"{scheme}://{container}/runs"})
    lines = [refused({"name": "azure", "root": f"s3://{container}/runs"})]
    assert "storage=azure needs storage.root=az://container/prefix" in lines[-1]
    # The endpoint from the config (a sovereign cloud's, say), the account and key from the environment.
    account_only = azure_server.connection_string.split("BlobEndpoint=")[0]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", account_only)
    check_storage({"name": "azure", "root": f"az://{container}/runs", "endpoint_url": azure_server.endpoint})

    wrong_key = azure_server.connection_string.replace(azure_server.key, "d3Jvbmcga2V5")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong_key)
    lines.append(refused({"name": "azure", "root": f"az://{container}/runs"}))
    assert "access denied, check the credentials in the environment (403 AuthorizationFailure)" in lines[-1]

    malformed = "bm90IGJhc2U2NCE"  # one character short of base64: the SDK cannot sign with it
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong_key.replace("d3Jvbmcga2V5", malformed))
    lines.append(refused({"name": "azure", "root": f"az://{container}/runs"}))
    assert (
        "the AccountKey in AZURE_STORAGE_CONNECTION_STRING is not a valid account key, which is base64 ("
        in (lines[-1])
    )
    assert malformed not in lines[-1]

    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    lines.append(refused({"name": "azure", "root": f"az://{container}/runs"}))
    assert "no credentials found" in lines[-1] and "AZURE_STORAGE_CONNECTION_STRING" in lines[-1]
    for line in lines:
        assert "\n" not in line and azure_server.key not in line, line


def test_azure_credentials_written_in_a_config_are_redacted():
    # litlab has no config key for them; a user's own (a data module reading blobs, say) is redacted.
    key = "Zm9yIHRoZSB0ZXN0IG9ubHk="
    connection = (
        f"DefaultEndpointsProtocol=https;AccountName=litlab;AccountKey={key};EndpointSuffix=core.windows.net"
    )
    config = {"data": {"account_key": key, "connection_string": connection, "account_name": "litlab"}}
    assert walk(config) == {
        "data": {"account_key": "***", "connection_string": "***", "account_name": "litlab"}
    }
    assert walk([f"+data.AccountKey={key}", f"data.connection_string='{connection}'"]) == [
        "+data.AccountKey=***",
        "data.connection_string=***",
    ]


def test_azure_refused_key_fails_before_torch_loads(log_dir, azure_server):
    container = azure_server.create_bucket("refused")
    wrong_key = azure_server.connection_string.replace(azure_server.key, "d3Jvbmcga2V5")
    result = litlab_checking_storage(
        *azure_server.storage(container, "runs"), env={"AZURE_STORAGE_CONNECTION_STRING": wrong_key}
    )
    fails_in_one_line(result, f"az://{container}/runs", "access denied")
    assert not run_dirs(log_dir) and azure_server.objects(container) == {}


def test_azure_lock_is_taken_once_and_a_stalled_upload_fails_within_its_bound(
    azure_server, monkeypatch, caplog
):
    """The lock is created by a conditional write (If-None-Match), once. An upload to a
    server that stopped reading (SIGSTOP) fails after its tries (here 1, of 1 s without progress;
    the kernel notices unacknowledged bytes at its next window probe) and not never, as adlfs's
    default client would; the blobs written before are intact and the server answers again."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_server.connection_string)
    caplog.set_level(logging.INFO)  # as the run logs (conf/hydra/default.yaml)
    container = azure_server.create_bucket("stalls")
    storage = {"name": "azure", "root": f"az://{container}/runs", "max_attempts": 1, "timeout_s": 1}
    options = storage_options(storage)
    use_storage_options(storage["root"], options)
    run = RunStorage(storage["root"], "default-0123456789", options)
    RunLock(run).acquire()
    with pytest.raises(FileExistsError):  # how a second start finds the lock taken
        run.fs.pipe_file(f"{run.fs._strip_protocol(run.root)}/{run.identity}.lock", b"{}", mode="create")
    run.write_text("summary.json", "{}")
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("azure")], "the SDK's request log"

    failure: list[BaseException] = []

    def upload() -> None:
        try:
            with writing(run.url, "checkpoints/last.ckpt", run.url_of("checkpoints/last.ckpt")):
                run.fs.pipe_file(f"{run.path}/checkpoints/last.ckpt", os.urandom(30_000_000))
        except BaseException as error:  # noqa: BLE001 - checked below
            failure.append(error)

    os.kill(azure_server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        uploading = threading.Thread(target=upload, daemon=True)
        uploading.start()
        uploading.join(timeout=30)  # without a bound on stalled sends: never
        took = time.monotonic() - started
    finally:
        os.kill(azure_server.pid, signal.SIGCONT)
    assert not uploading.is_alive(), "the upload to a stopped server never failed"
    (error,) = failure
    assert isinstance(error, StorageFailed), error
    assert f"endpoint {azure_server.endpoint} did not answer after 1 attempts" in str(error)
    assert took < 2 * 1 + 3, took  # twice the timeout: the window probe after it; plus the buffers' filling
    objects = azure_server.objects(container)
    assert objects["runs/default-0123456789/summary.json"] == b"{}"
    assert "runs/default-0123456789/checkpoints/last.ckpt" not in objects  # a blob is whole or absent


def test_azure_requests_are_bounded_as_the_docs_say(monkeypatch):
    # conf/storage/azure.yaml and docs/storage.md: 5 tries of at most 10 s, backoffs <= 4+6+10+18 s.
    from litlab.storage.azure_blob import AzureBlobFileSystemBounded

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=litlab;AccountKey=a2V5")
    options = storage_options({"root": "az://container/prefix", "max_attempts": 5, "timeout_s": 10})
    assert options == {"max_attempts": 5, "timeout_s": 10.0}
    client = AzureBlobFileSystemBounded(**options, skip_instance_cache=True).service_client  # connects lazily
    policy, transport = client._config.retry_policy, client._config.transport
    counters = (policy.total_retries, policy.connect_retries, policy.read_retries, policy.status_retries)
    assert counters == (4, 4, 4, 4)  # a request is sent 1 + 4 times, whatever fails
    assert (transport.connection_config.timeout, transport.connection_config.read_timeout) == (10, 10)
    monkeypatch.setattr(random.Random, "uniform", lambda self, low, high: high)  # the longest jitter
    # The SDK counts a retry before it waits: the waits are those of counts 1 to 4.
    assert sum(policy.get_backoff_time({"count": n}) for n in range(1, 5)) == 38
