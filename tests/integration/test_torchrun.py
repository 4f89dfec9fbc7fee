"""torchrun (TorchElastic) starts the ranks, on one node and on two nodes simulated on this machine;
Lightning adopts them (TorchElasticEnvironment), every rank names the same run folder, and
``--max-restarts`` restarts a group that lost a worker, which resumes from its last checkpoint."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.conftest import BIN, REPO, TINY, command_env, ok, ranks_that_joined, run_dirs, summary

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "scripts" / "torchrun"
TIMEOUT_S = 300


def _env(log_dir: Path, **extra: str) -> dict[str, str]:
    # The scripts call `torchrun`, which must be litlab's (the venv's bin may not be on PATH). The
    # ranks torchrun starts (`python -m litlab.cli.train`) start warm (tests/warm_jobs/sitecustomize.py):
    # each is still a process of torchrun's, whose stand-in exits as the rank does.
    return command_env(
        {"PATH": f"{BIN}:{os.environ['PATH']}", "LITLAB_LOG_DIR": str(log_dir), **extra}, warm_jobs=True
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_two_ranks_share_the_run_folder_they_each_name(log_dir: Path):
    # scripts/torchrun/single_node.sh with NPROC=2 runs exactly:
    # torchrun --nproc-per-node=2 -m litlab.cli.train trainer.devices=2 strategy=ddp trainer.accelerator=cpu
    # Each rank runs Hydra and names the run's folder from the command: the same one, unasked.
    result = subprocess.run(
        [str(SCRIPTS / "single_node.sh"), "trainer.accelerator=cpu", *TINY],
        env=_env(log_dir, NPROC="2"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    ok(result)
    runs = run_dirs(log_dir)
    assert [p.name for p in (log_dir / "train" / "runs").iterdir()] == [runs[0].name], runs  # one folder
    (run,) = runs
    result = summary(run)
    assert result["status"] == "completed"
    assert (result["world_size"], result["devices"], result["strategy"]) == (2, 2, "ddp")
    assert result["cluster_environment"] == "TorchElasticEnvironment"  # torchrun's ranks, none from Lightning
    assert ranks_that_joined(run) == ["0 1/2", "1 2/2"]
    assert list(log_dir.glob("**/summary.json")) == [run / "summary.json"]  # written once, by rank 0


def test_torchrun_two_nodes_train_with_global_rank_zero_alone_writing(tmp_path: Path):
    # Two "nodes" on 127.0.0.1, one process each, each with a log folder of its own (LITLAB_LOG_DIR):
    # node 1's rank still writes into global rank 0's run directory (its absolute path), and only
    # global rank 0 writes summary.json, checkpoints and .hydra.
    port = str(_free_port())
    node_logs = [tmp_path / "node0" / "logs", tmp_path / "node1" / "logs"]
    nodes = [
        subprocess.Popen(
            [str(SCRIPTS / "multi_node.sh"), "trainer.accelerator=cpu", *TINY],
            env=_env(logs, NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, logs in enumerate(node_logs)
    ]
    try:
        outputs = [node.communicate(timeout=TIMEOUT_S)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]

    (run,) = run_dirs(node_logs[0])
    result = summary(run)
    assert result["status"] == "completed"
    assert (result["world_size"], result["num_nodes"], result["devices"]) == (2, 2, 1)
    assert result["cluster_environment"] == "TorchElasticEnvironment"
    # Node 1's rank names the same run folder, in its own log folder (not shared here, as on two
    # machines without a shared filesystem): it holds that rank's log lines and nothing else.
    node1_run = node_logs[1] / "train" / "runs" / run.name
    assert [p.relative_to(node_logs[1]) for p in node_logs[1].rglob("*") if p.is_file()] == [
        node1_run.relative_to(node_logs[1]) / "train.log"
    ]
    assert ranks_that_joined(run) + ranks_that_joined(node1_run) == ["0 1/2", "1 2/2"]
    assert list(node_logs[0].glob("**/summary.json")) == [run / "summary.json"]


def test_torchrun_max_restarts_restarts_a_group_that_lost_a_worker_and_it_resumes(log_dir: Path):
    command = [
        str(BIN / "torchrun"),
        "--nproc-per-node=2",
        "--max-restarts=1",
        "-m",
        "litlab.cli.train",
        "trainer.devices=2",
        "strategy=ddp",
        "trainer.accelerator=cpu",
        *TINY,
        "trainer.limit_train_batches=10",  # the whole epoch of each rank: 9 whole global batches of 2 x 64
        "callbacks.checkpoint.every_n_train_steps=2",
        "callbacks.progress.every_n_steps=1",
    ]
    process = subprocess.Popen(
        command, env=_env(log_dir), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        reached = re.search(r"\] epoch \d+(?:/\d+)? step (\d+):", line)
        if reached and int(reached.group(1)) >= 5:
            (worker,) = [w for w in psutil.Process(process.pid).children() if w.environ().get("RANK") == "1"]
            worker.kill()  # SIGKILL, mid-run
            break
    seen.append(process.stdout.read())
    process.wait(timeout=TIMEOUT_S)
    output = "".join(seen)
    assert process.returncode == 0, output[-4000:]
    (run,) = run_dirs(log_dir)  # the restarted group kept the first one's run directory
    result = summary(run)
    assert (result["status"], result["resumed_count"], result["world_size"]) == ("completed", 1, 2)
    assert result["global_step"] == 9
    resumed = re.findall(r"resuming from \S+checkpoints/(\S+) \(epoch 0, step (\d+)\)", output)
    assert len(resumed) >= 1 and int(resumed[0][1]) >= 4, output[
        -4000:
    ]  # from a checkpoint of the killed group
