"""A real Azure Blob Storage server on 127.0.0.1 for the tests: Azurite (npm package ``azurite``).

Azurite checks Shared Key signatures as Azure does. It runs with one account of its own whose key is
random per session (``AZURITE_ACCOUNTS``), so the test that no written byte holds the key cannot
pass by chance; a litlab process gets the account only through ``AZURE_STORAGE_CONNECTION_STRING``,
as Azure's tools read it. Where ``azurite-blob`` is missing, the suite installs it with npm into a
cache folder (about 15 s, once per machine); a test is skipped only where npm cannot. The helpers
below read the server with Azure's own SDK, not with litlab's filesystem (adlfs).
"""

from __future__ import annotations

import base64
import fcntl
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.s3_server import free_port, stop, wait_until_up

NPM_PREFIX = Path.home() / ".cache" / "litlab-tests" / "azurite"
ACCOUNT = "litlab"


@dataclass
class AzureServer:
    endpoint: str  # the blob service of the account: http://127.0.0.1:PORT/<account>
    key: str
    pid: int
    name = "azure"
    scheme = "az"

    @property
    def secrets(self) -> list[str]:
        return [self.key]

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={self.key};"
            f"BlobEndpoint={self.endpoint};"
        )

    def env(self) -> dict[str, str]:
        """Environment of a litlab process that uses this server (the account only from here)."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def storage(self, bucket: str, prefix: str) -> list[str]:
        """The litlab overrides that store a run under ``az://bucket/prefix`` (the account from env())."""
        return ["storage=azure", f"storage.root=az://{bucket}/{prefix}"]

    def client(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_bucket(self, name: str) -> str:
        """A container."""
        self.client().create_container(name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every blob of the container: name -> contents."""
        container = self.client().get_container_client(bucket)
        return {blob.name: container.download_blob(blob.name).readall() for blob in container.list_blobs()}


def azurite_blob() -> Path:
    """The ``azurite-blob`` executable: on PATH, in the cache folder, or installed there with npm."""
    on_path = shutil.which("azurite-blob")
    if on_path:
        return Path(on_path)
    executable = NPM_PREFIX / "node_modules" / ".bin" / "azurite-blob"
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("Azurite is not installed and cannot be: no npm/node here (npm install -g azurite)")
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    with (NPM_PREFIX / ".install.lock").open("w") as lock:  # two xdist workers install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not executable.exists():
            installed = subprocess.run(
                ["npm", "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund", "azurite@3"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if installed.returncode != 0 or not executable.exists():
                tail = " ".join(installed.stderr.split()[-30:])
                pytest.skip(f"Azurite is not installed and npm could not install it: {tail}")
    return executable


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureServer]:
    """azurite-blob (in memory) on a free localhost port for the whole session, stopped (by its PID)
    afterwards."""
    executable = azurite_blob()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    folder = tmp_path_factory.mktemp("azurite")
    command = [str(executable), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    command += ["--skipApiVersionCheck", "--disableTelemetry"]
    with (folder / "azurite.log").open("w") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=folder,  # where Azurite would leave any file of its own
            env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"},
        )
    try:
        wait_until_up(f"{url}/", process)
        yield AzureServer(endpoint=f"{url}/{ACCOUNT}", key=key, pid=process.pid)
    finally:
        stop(process)
