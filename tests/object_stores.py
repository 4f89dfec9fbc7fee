"""One test, every object store: the ``object_store`` fixture runs a test once per cloud's server.

Each server fixture (``s3_server``: moto, ``gcs_server``: gcp-storage-emulator, ``azure_server``:
Azurite), session-scoped and started on 127.0.0.1, returns an object with the same interface, so a
test says what must hold and not how each cloud is reached:

- ``name`` (``s3``, ``gcs``, ``azure``: the storage config) and ``scheme`` (``s3``, ``gs``, ``az``);
- ``endpoint``: the server's URL; ``pid``: its process (a test stops it with SIGSTOP);
- ``env()``: the environment a litlab process needs to use it (credentials only there);
- ``storage(bucket, prefix)``: the litlab overrides that store runs under ``<scheme>://bucket/prefix``;
- ``create_bucket(name)`` (returns the name) and ``objects(bucket)`` (key -> bytes, read without
  litlab's library);
- ``secrets``: the strings (credentials) that must appear in no byte a run writes.
"""

from __future__ import annotations

import pytest

OBJECT_STORES = ["s3", "gcs", "azure"]


# Function-scoped, over session-scoped servers (one per session each): a session-scoped parameter
# would make pytest run every file's s3 tests, then every file's gcs tests..., and tear down and
# set up again each module's fixtures in between (test_resume.py's uninterrupted run: ~15 s each).
@pytest.fixture(params=OBJECT_STORES)
def object_store(request: pytest.FixtureRequest):
    """The server of each object store in turn (``<name>_server``); skipped where none is available."""
    try:
        return request.getfixturevalue(f"{request.param}_server")
    except pytest.FixtureLookupError:
        pytest.skip(f"no {request.param}_server fixture: the {request.param} server is not part of the tests")
