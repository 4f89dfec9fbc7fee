"""Slurm and submitit: the example batch script and ``hydra/launcher=slurm`` on a real single-node
Slurm cluster (scripts/slurm/up.sh, the ``slurm_cluster`` fixture), and ``hydra/launcher=submitit_local``
on this machine. In all of them the launcher creates the ranks and Lightning launches nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR
from tests.conftest import (
    BIN,
    FAULTS_IMPORTABLE,
    REPO,
    TINY,
    litlab,
    ok,
    ranks_that_joined,
    run_dirs,
    summary,
)
from tests.slurm_cluster import SlurmCluster

schema.register()
# Our submitit_local.yaml is matched against the plugin's schema of that name on purpose (litlab.launch).
pytestmark = pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/submitit_local' is validated:UserWarning")

JOB_TIMEOUT_S = 300
CPU_DDP = ["trainer.accelerator=cpu", "strategy=ddp"]


def launcher_params(*overrides: str) -> dict:
    """The resolved ``hydra.launcher`` node, as the launcher's constructor receives it."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def test_slurm_launcher_sizes_the_job_from_the_trainer_config():
    gpu = launcher_params("hydra/launcher=slurm", "trainer=gpu", "trainer.devices=8", "trainer.num_nodes=2")
    assert (gpu["nodes"], gpu["tasks_per_node"], gpu["gpus_per_node"]) == (2, 8, 8)
    assert gpu["signal_delay_s"] > 0 and gpu["max_num_timeout"] > 0  # preemption: signal, then requeue
    assert gpu["name"] == "litlab-default"
    cpu = launcher_params("hydra/launcher=slurm", "trainer.devices=2")
    assert (cpu["nodes"], cpu["tasks_per_node"], cpu["gpus_per_node"]) == (1, 2, None)
    local = launcher_params("hydra/launcher=submitit_local", "trainer.devices=2")
    assert local["_target_"].endswith("LocalLauncher")
    assert (local["tasks_per_node"], local["gpus_per_node"]) == (2, None)


def test_batch_script_asks_for_the_requeue_signal_lightning_handles():
    script = (REPO / "scripts" / "slurm" / "train.sbatch").read_text()
    directives = {line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")}
    # SLURMEnvironment's auto-requeue listens for SIGUSR1: checkpoint, then `scontrol requeue`.
    assert {"--signal=USR1@90", "--requeue", "--open-mode=append"} <= directives
    assert any(d.startswith("--ntasks-per-node=") for d in directives)  # Lightning rejects --ntasks
    assert "srun litlab-train" in script


def test_slurm_launcher_refuses_devices_auto_naming_the_key():
    with pytest.raises(Exception, match=r"trainer.devices=auto cannot size a Slurm job"):
        launcher_params("hydra/launcher=slurm", "trainer.devices=auto")


def _slurm_env(cluster: SlurmCluster) -> dict[str, str]:
    # sbatch hands its environment to the job: litlab's venv and source must be found there.
    return {
        **os.environ,
        "SLURM_CONF": str(cluster.conf_path),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }


def _wait_until_finished(cluster: SlurmCluster, job_id: str) -> str:
    """Poll squeue (sbatch --wait polls slowly, up to half a minute late), then sacct's final state."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while cluster.run("squeue", "-h", "-j", job_id, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued or running"
        time.sleep(1)
    state = ""
    while time.monotonic() < deadline:  # slurmctld reports to slurmdbd asynchronously
        state = cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", timeout=30).stdout.strip()
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            break
        time.sleep(1)
    return state


def submit_train_batch(
    cluster: SlurmCluster, out: Path, *args: str, env: dict[str, str] | None = None
) -> str:
    """``sbatch scripts/slurm/train.sbatch ARGS`` as 1 node x 2 tasks, output to ``out``; the job id.
    ``env``: added to the job's environment."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=10"]
        + [f"--output={out}", str(REPO / "scripts" / "slurm" / "train.sbatch"), *args],
        env={**_slurm_env(cluster), **(env or {})},
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    ok(submitted)
    return submitted.stdout.strip().split(";")[0]


@pytest.mark.slow
def test_batch_script_runs_two_slurm_tasks_as_two_ranks_in_one_run_directory(
    slurm_cluster: SlurmCluster, log_dir: Path, tmp_path: Path
):
    out = tmp_path / "job.out"
    job_id = submit_train_batch(slurm_cluster, out, *CPU_DDP, *TINY)
    state = _wait_until_finished(slurm_cluster, job_id)
    assert state == "COMPLETED", f"{state}\n{out.read_text()[-3000:]}"

    # Both tasks ran Hydra, and both named the same run folder from the command.
    (run,) = run_dirs(log_dir)
    result = summary(run)
    assert run.name == result["run_name"]
    assert result["status"] == "completed"
    assert (result["world_size"], result["devices"], result["num_nodes"]) == (2, 2, 1)
    assert result["cluster_environment"] == "SLURMEnvironment"  # Slurm's tasks are the ranks
    assert ranks_that_joined(run) == ["0 1/2", "1 2/2"]  # two ranks, one process group
    assert (run / ".hydra" / "config.yaml").is_file()
    assert list(log_dir.glob("**/summary.json")) == [run / "summary.json"]  # rank 0's, once


@pytest.mark.slow
def test_slurm_launcher_multirun_submits_one_job_per_point_each_with_two_ranks(
    slurm_cluster: SlurmCluster, log_dir: Path, tmp_path: Path
):
    launcher = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10"]
    result = litlab(
        "litlab-train",
        "-m",
        *launcher,
        "hydra.launcher.partition=debug",
        "trainer.devices=2",
        *CPU_DDP,
        "seed=1,2",
        *TINY,
        env=_slurm_env(slurm_cluster),
        cwd=tmp_path,  # submitit may leave a .submitit/ folder in the working directory
        timeout=JOB_TIMEOUT_S * 2,
    )
    ok(result)
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [job.name for job in jobs] == ["0", "1"]
    # Each job's folder is its run's, listed in the sweep's; every rank wrote there, and started once.
    assert sorted(job.resolve() for job in jobs) == run_dirs(log_dir)
    assert [len(json.loads((job / "run.json").read_text())["starts"]) for job in jobs] == [1, 1]
    for job, seed in zip(jobs, ("seed=1", "seed=2"), strict=True):
        job_summary = summary(job)
        assert job_summary["status"] == "completed"
        assert seed in job_summary["overrides"]
        assert (job_summary["world_size"], job_summary["cluster_environment"]) == (2, "SLURMEnvironment")
        assert ranks_that_joined(job) == ["0 1/2", "1 2/2"]

    # The sbatch script submitit generated: one array of two jobs, each 1 node x 2 tasks, no GPUs,
    # and the signal submitit turns into a requeue before the time limit.
    (script,) = sweep.glob(".submitit/*/*_submission.sh")
    directives = {line.split()[1] for line in script.read_text().splitlines() if line.startswith("#SBATCH")}
    for expected in (
        "--nodes=1",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--partition=debug",
        "--time=10",
        "--job-name=litlab-default",
        "--signal=USR2@120",
        "--array=0-1%2",  # two points; at most min(points, array_parallelism) at once
    ):
        assert expected in directives, (expected, sorted(directives))
    assert not any(d.startswith("--gpus") for d in directives)


@pytest.mark.slow
def test_submitit_local_job_tasks_become_the_ranks_of_one_run(log_dir: Path, tmp_path: Path):
    report = tmp_path / "process"
    result = litlab(
        "litlab-train",
        "-m",
        "hydra/launcher=submitit_local",
        "trainer.devices=2",
        *CPU_DDP,
        *TINY,
        "model=mlp",
        "model.net._target_=tests.faults.MLPReportingItsRank",
        cwd=tmp_path,
        timeout=JOB_TIMEOUT_S,
        env={**FAULTS_IMPORTABLE, "LITLAB_TEST_REPORT": str(report)},
    )
    ok(result)
    assert "validated against ConfigStore schema" not in result.stdout + result.stderr
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    (job,) = (p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    job_summary = summary(job)
    assert job_summary["status"] == "completed"
    # submitit started both ranks; Lightning adopted them (LOCAL_RANK set) and launched none.
    assert (job_summary["world_size"], job_summary["cluster_environment"]) == (2, "LightningEnvironment")
    assert ranks_that_joined(job) == ["0 1/2", "1 2/2"]
    # Each rank is the job's single-run process started by submitit's task of that rank (every sweep
    # job runs as a child of the process the launcher started), not rank 0's child: a rank Lightning
    # launched would be rank 0's child, with rank 0's submitit id.
    ranks = [json.loads(Path(f"{report}.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["submitit"] for r in ranks] == ["0", "1"], ranks
    assert ranks[1]["ppid"] != ranks[0]["pid"] and ranks[0]["ppid"] != ranks[1]["ppid"], ranks
