"""A real GCS-speaking HTTP server on 127.0.0.1 for the tests: the pip-installed ``gcp-storage-emulator``.

It serves Google's JSON API, the one litlab's gcsfs filesystem speaks, and checks no credentials:
a litlab process finds it through ``STORAGE_EMULATOR_HOST``, as Google's own clients do, and then
connects anonymously (``litlab.storage.roots.storage_options``). The test helpers below read and
write it with plain HTTP requests, not with the library under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.s3_server import free_port, stop, wait_until_up


@dataclass
class GCSServer:
    endpoint: str
    pid: int
    name = "gcs"
    scheme = "gs"

    @property
    def secrets(self) -> list[str]:
        """None: the emulator takes no credentials, so a litlab process has none to leak."""
        return []

    def env(self) -> dict[str, str]:
        """Environment of a litlab process that uses this server: the emulator's address, nothing of
        this machine's Google credentials (a credentials file that does not exist, no metadata server)."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/google-credentials.json",
            "NO_GCE_CHECK": "true",
        }

    def storage(self, bucket: str, prefix: str) -> list[str]:
        """The litlab overrides that store a run under ``gs://bucket/prefix`` (the endpoint from env())."""
        return ["storage=gcs", f"storage.root=gs://{bucket}/{prefix}"]

    def _call(self, method: str, path: str, body: dict | None = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.endpoint}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()

    def create_bucket(self, name: str) -> str:
        self._call("POST", "/storage/v1/b?project=litlab-tests", {"name": name})
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
        )
        urllib.request.urlopen(request, timeout=10).read()

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of the bucket: key -> contents."""
        keys: list[str] = []
        token = ""
        while True:
            page = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?pageToken={token}"))
            keys += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                break
        download = "/download/storage/v1/b/{}/o/{}?alt=media"
        return {
            key: self._call("GET", download.format(bucket, urllib.parse.quote(key, safe=""))) for key in keys
        }


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    """gcp-storage-emulator (in memory) on a free localhost port for the whole session, stopped (by
    its PID) afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gcs") / "gcp-storage-emulator.log"
    executable = Path(sys.executable).parent / "gcp-storage-emulator"
    if not executable.exists():
        pytest.skip("gcp-storage-emulator is not installed (pip install gcp-storage-emulator)")
    with log.open("w") as output:
        process = subprocess.Popen(
            [str(executable), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_up(f"{url}/", process)
        yield GCSServer(endpoint=url, pid=process.pid)
    finally:
        stop(process)
