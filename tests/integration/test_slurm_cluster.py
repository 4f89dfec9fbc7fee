"""The single-node test Slurm cluster (scripts/slurm/) runs jobs, accounts them,
and works with submitit the way hydra-submitit-launcher uses it."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

try:  # tests/ as a package, or tests/ on sys.path (pytest's default rootdir mode)
    from tests.slurm_cluster import SlurmCluster, session_lease, slurm_cluster  # noqa: F401
except ImportError:  # pragma: no cover - depends on how pytest imports tests/
    from slurm_cluster import SlurmCluster, session_lease, slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 180


def _sacct_state(cluster: SlurmCluster, job_id: str) -> str:
    out = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", timeout=30)
    assert out.returncode == 0, f"sacct failed: {out.stderr}"
    return out.stdout.strip()


def _wait_sacct_state(cluster: SlurmCluster, job_id: str, want: str) -> str:
    """slurmctld sends job records to slurmdbd asynchronously: poll for a while."""
    deadline = time.monotonic() + 60
    state = ""
    while time.monotonic() < deadline:
        state = _sacct_state(cluster, job_id)
        if state == want:
            break
        time.sleep(1)
    return state


@pytest.fixture(scope="module")
def hostname_job(slurm_cluster: SlurmCluster, tmp_path_factory) -> tuple[str, list[str]]:
    """A 2-task batch job that runs `srun hostname`; returns (job id, output lines)."""
    workdir = tmp_path_factory.mktemp("sbatch")
    out_file = workdir / "job.out"
    proc = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--wait",
        "--ntasks=2",
        "--time=5",
        f"--output={out_file}",
        "--wrap",
        "srun hostname",
        cwd=workdir,
        timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"sbatch failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
    job_id = proc.stdout.strip().splitlines()[0].split(";")[0]
    assert job_id.isdigit(), proc.stdout
    return job_id, out_file.read_text().splitlines()


def test_sbatch_two_tasks_run_srun(hostname_job, slurm_cluster: SlurmCluster):
    _, lines = hostname_job
    # No --mem asked: the job must still have been scheduled (CR_CPU).
    assert len(lines) == 2, lines
    hostname = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert all(line.strip() == hostname for line in lines), lines


def test_sacct_reports_completed(hostname_job, slurm_cluster: SlurmCluster):
    job_id, _ = hostname_job
    assert _wait_sacct_state(slurm_cluster, job_id, "COMPLETED") == "COMPLETED"


def _executor(cluster: SlurmCluster, folder, monkeypatch, **params):
    submitit = pytest.importorskip("submitit")
    cluster.apply(monkeypatch)  # submitit shells out to sbatch/sacct
    # cluster="slurm": fail loudly instead of silently running locally.
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition=cluster.partition, nodes=1, timeout_min=5, **params)
    return executor


def _wait_done(job, timeout: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not job.done():
        assert time.monotonic() < deadline, f"submitit job {job.job_id} not done: {job.state}"
        time.sleep(1)


def _wait_submitit_state(job, want: str, timeout: float = 60) -> str:
    """done() may see the result files before sacct has the final state: poll sacct."""
    deadline = time.monotonic() + timeout
    state = job.state
    while state != want and time.monotonic() < deadline:
        time.sleep(1)
        state = job.watcher.get_state(job.job_id, mode="force")
    return state


def test_submitit_two_tasks_return_their_rank(slurm_cluster: SlurmCluster, tmp_path, monkeypatch):
    executor = _executor(slurm_cluster, tmp_path / "submitit", monkeypatch, tasks_per_node=2)

    # Local function: cloudpickle ships it by value, so the job needs no import of tests/.
    def slurm_procid() -> str:
        import os

        return os.environ["SLURM_PROCID"]

    job = executor.submit(slurm_procid)
    _wait_done(job)
    assert sorted(job.results()) == ["0", "1"]
    assert _wait_submitit_state(job, "COMPLETED") == "COMPLETED"


def test_submitit_killed_task_raises_instead_of_hanging(slurm_cluster: SlurmCluster, tmp_path, monkeypatch):
    """Needs accounting: without sacct the state stays UNKNOWN and result() hangs."""
    from submitit.core.utils import UncompletedJobError

    executor = _executor(slurm_cluster, tmp_path / "submitit", monkeypatch, tasks_per_node=1)

    def die_hard() -> None:
        import os

        os._exit(3)  # no result file is written: submitit must learn it from sacct

    job = executor.submit(die_hard)
    _wait_done(job)
    with pytest.raises(UncompletedJobError):
        job.result()
    assert _wait_submitit_state(job, "FAILED") == "FAILED"


def _status(cluster: SlurmCluster) -> subprocess.CompletedProcess:
    return cluster.script("up.sh", "--status", timeout=30)


def test_sessions_share_the_cluster_and_only_the_last_lease_stops_it(slurm_cluster: SlurmCluster):
    """Two test sessions at once on one machine (CI beside a developer) must not stop each other's
    cluster: up.sh calls take turns, and down.sh --release stops nothing while a lease is held."""
    ours = session_lease()
    # Named after this session: another session may run this test at the same time.
    first, second = f"{ours}-other-a", f"{ours}-other-b"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with ThreadPoolExecutor(2) as pool:
            ups = list(
                pool.map(
                    lambda name: slurm_cluster.script("up.sh", "--lease", name, "--pid", str(holder.pid)),
                    [first, second],
                )
            )
        assert [up.returncode for up in ups] == [0, 0], [up.stderr for up in ups]
        status = _status(slurm_cluster)
        for lease in (first, second, ours):
            assert f"lease {lease}: held" in status.stdout, status.stdout

        released = slurm_cluster.script("down.sh", "--release", first)
        assert released.returncode == 0, released.stderr
        assert "stays up for" in released.stderr, released.stderr
        assert _status(slurm_cluster).returncode == 0, "releasing one lease stopped a cluster still leased"

        # A lease whose process died holds nothing: the next release drops it.
        holder.kill()
        holder.wait()
        # (Another session's release may already have dropped it.)
        assert f"lease {second}: held" not in _status(slurm_cluster).stdout
        released = slurm_cluster.script("down.sh", "--release", first)
        assert released.returncode == 0, released.stderr
        still_holding = released.stderr.split("the cluster stays up for:")[-1].split()
        assert ours in still_holding and second not in still_holding, released.stderr
        assert not (slurm_cluster.dir / "leases" / second).exists()
    finally:
        holder.kill()
        holder.wait()
    job = slurm_cluster.run(
        "sbatch", "--wait", "--time=1", "--output=/dev/null", "--wrap", "true", timeout=JOB_TIMEOUT_S
    )
    assert job.returncode == 0, f"the cluster no longer runs jobs: {job.stdout}{job.stderr}"
