"""A real single-node Slurm cluster for tests (pytest fixture module).

Import it from ``conftest.py``::

    from tests.slurm_cluster import slurm_cluster  # noqa: F401

(or ``from slurm_cluster import slurm_cluster`` when ``tests/`` is on sys.path).

The session-scoped ``slurm_cluster`` fixture runs ``scripts/slurm/up.sh`` (which
installs Slurm, munge and MariaDB with apt-get the first time) with a lease for
this pytest process, and yields a :class:`SlurmCluster`. At the end of the session
``scripts/slurm/down.sh --release`` gives the lease back; the daemons stop only if
nobody else holds one. So test sessions that run at the same time on one machine
(two checkouts, CI beside a developer) share one cluster instead of stopping each
other's, and a cluster someone started by hand with ``up.sh`` stays up.

The test is skipped only when the machine cannot host the cluster at all (not
root, or neither Slurm nor apt-get available); any other failure to start is an
error, with the script's output in the message.

Slurm clients find the cluster through ``SLURM_CONF``: pass ``cluster.env`` to
subprocesses, or ``cluster.apply(monkeypatch)`` for in-process callers such as
submitit / hydra-submitit-launcher.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts" / "slurm"
DEFAULT_DIR = "/tmp/litlab-slurm"
# First start installs packages (about a minute); later starts take seconds. up.sh may first wait
# (up to 600 s, LITLAB_SLURM_LOCK_TIMEOUT) for another session's up.sh or down.sh to finish.
UP_TIMEOUT_S = 900
DOWN_TIMEOUT_S = 180


@dataclass(frozen=True)
class SlurmCluster:
    """Handle on the running test cluster."""

    conf_path: Path
    """slurm.conf of the cluster (what SLURM_CONF points to)."""
    dir: Path
    """Scratch folder holding its configs, state, logs and database."""
    env: dict[str, str] = field(repr=False)
    """A copy of os.environ plus SLURM_CONF, for subprocess calls."""
    partition: str = "debug"

    def apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Export SLURM_CONF in this process (for submitit, which shells out to sbatch)."""
        monkeypatch.setenv("SLURM_CONF", str(self.conf_path))

    def run(self, *cmd: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, sacct, ...) against this cluster."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(list(cmd), env=self.env, timeout=timeout, check=False, **kwargs)

    def script(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run scripts/slurm/<name> (up.sh, down.sh) on this cluster's folder."""
        return _script(name, self.dir, *args, timeout=timeout)


def _skip_reason() -> str | None:
    """Why this machine cannot host the cluster at all, or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "slurm_cluster needs root (slurmd launches jobs, munged runs as 'munge')"
    have_slurm = all(
        shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        for b in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch")
    )
    if not have_slurm and shutil.which("apt-get") is None:
        return "slurm_cluster needs apt-get to install Slurm/MariaDB (not installed, no apt-get)"
    return None


def _script(name: str, scratch: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, LITLAB_SLURM_DIR=str(scratch))
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)

    scratch = Path(os.environ.get("LITLAB_SLURM_DIR", DEFAULT_DIR))
    lease = session_lease()
    up = _script("up.sh", scratch, "--lease", lease, "--pid", str(os.getpid()), timeout=UP_TIMEOUT_S)
    if up.returncode != 0:
        # Do not leave half a cluster behind (unless another session holds it).
        _script("down.sh", scratch, "--release", lease, timeout=DOWN_TIMEOUT_S)
        raise RuntimeError(
            f"scripts/slurm/up.sh failed (exit {up.returncode}):\n{_tail(up.stdout)}\n{_tail(up.stderr)}"
        )

    conf_path = scratch / "etc" / "slurm.conf"
    exports = [ln for ln in up.stdout.splitlines() if ln.startswith("export SLURM_CONF=")]
    if exports:
        conf_path = Path(exports[-1].split("=", 1)[1])
    cluster = SlurmCluster(
        conf_path=conf_path,
        dir=scratch,
        env=dict(os.environ, SLURM_CONF=str(conf_path)),
    )
    try:
        yield cluster
    finally:
        down = _script("down.sh", scratch, "--release", lease, timeout=DOWN_TIMEOUT_S)
        if down.returncode != 0:
            raise RuntimeError(
                f"scripts/slurm/down.sh failed (exit {down.returncode}):\n"
                f"{_tail(down.stdout)}\n{_tail(down.stderr)}"
            )


def session_lease() -> str:
    """The name of this pytest process's lease on the cluster."""
    return f"pytest-{os.getpid()}"
