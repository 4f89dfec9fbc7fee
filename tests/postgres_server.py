"""A real PostgreSQL 15 server on 127.0.0.1 for the tests, in a temporary folder (the ``postgres_server``
fixture).

PostgreSQL refuses to run as root, so ``initdb`` and ``pg_ctl`` run as the ``postgres`` user
(``runuser``) on a folder that user owns; the server listens on a free port of 127.0.0.1 only, trusts
local connections (no password: nothing secret in the URLs tests print), and is stopped with
``pg_ctl -m fast stop`` when the test ends. ``stop()`` and ``start()`` take it down and bring it back
mid-test, on the same port and data, as a restart or a failover does. Starting it takes about a
second. Where the binaries are missing they are installed with apt-get (root machines: a
developer's, CI's); the test is skipped only on a machine that can do neither.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.s3_server import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"  # the operating-system user that runs the server
ROLE = "litlab"  # the database role the tests connect as


@dataclass
class PostgresServer:
    port: int
    database: str
    folder: Path

    @property
    def url(self) -> str:
        """The URL a user would type (litlab maps postgresql:// to psycopg 3)."""
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        data, log = str(self.folder / "data"), str(self.folder / "server.log")
        _as_postgres(str(BIN / "pg_ctl"), "-D", data, "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        _as_postgres(str(BIN / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")


def _as_postgres(*command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
    result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}"
        )
    return result


def _ensure_binaries() -> None:
    if (BIN / "initdb").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"PostgreSQL 15 is not in {BIN} and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, capture_output=True, env=env, timeout=300)
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "postgresql-15"],
        check=True,
        capture_output=True,
        env=env,
        timeout=600,
    )


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    _ensure_binaries()
    folder = Path(tempfile.mkdtemp(prefix="litlab-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        shutil.chown(folder, USER, USER)
    server = PostgresServer(port=free_port(), database="litlab", folder=folder)
    _as_postgres(str(BIN / "initdb"), "-A", "trust", "-U", ROLE, "-D", str(data))
    server.start()
    try:
        _as_postgres(str(BIN / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", ROLE, "litlab")
        yield server
    finally:
        try:
            if (data / "postmaster.pid").exists():  # a test may leave it stopped
                server.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
