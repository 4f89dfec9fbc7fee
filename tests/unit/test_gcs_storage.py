"""storage=gcs's filesystem (``litlab.storage.gcs_bounded``): each request tried storage.max_attempts
times, credentials never sent to an emulator, whatever fsspec opened gs:// URLs with before; counted
against a local HTTP server that answers 503."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import fsspec
import pytest

from litlab.storage.roots import StorageFailed, open_through_bounded_filesystems, storage_options, writing

gcsfs = pytest.importorskip("gcsfs")


@pytest.fixture
def unavailable() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A local endpoint that answers every request with 503, and the headers of the requests it got."""
    requests: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(dict(self.headers))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def test_a_gcs_request_is_tried_max_attempts_times_and_an_emulator_gets_no_credentials(
    unavailable, monkeypatch
):
    endpoint, requests = unavailable
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    fsspec.register_implementation("gs", gcsfs.GCSFileSystem, clobber=True)  # used before litlab ran
    config = {"name": "gcs", "root": "gs://bucket/runs", "max_attempts": 2, "timeout_s": 1.0}
    options = storage_options(config)
    assert options == {"token": "anon", "max_attempts": 2, "timeout_s": 1.0}
    open_through_bounded_filesystems()  # as a run does again (use_storage_options), after the notebook's
    fs = fsspec.filesystem("gs", **options, skip_instance_cache=True)
    assert type(fs).__name__ == "GCSFileSystemBounded", type(fs)
    with pytest.raises(Exception, match="503"):
        fs.cat_file("bucket/runs/summary.json")
    assert len(requests) == 2  # gcsfs alone tries 6 times
    assert not [r for r in requests if "Authorization" in r], "credentials were sent to the emulator"

    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    assert "token" not in storage_options(config)  # Google's credential chain, outside an emulator


def test_a_gcs_error_status_is_the_storage_s_failure_in_one_line(unavailable, monkeypatch):
    endpoint, _ = unavailable
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    fs = fsspec.filesystem(
        "gs", **storage_options({"root": "gs://b/runs", "max_attempts": 1}), skip_instance_cache=True
    )
    with pytest.raises(StorageFailed) as failed, writing("gs://b/runs", "summary.json"):
        fs.pipe_file("b/runs/summary.json", b"{}")
    assert failed.value.cause == "HttpError: 503", failed.value.cause  # not a traceback
