"""torchrun (TorchElastic) starts the ranks, on one node and on two nodes simulated on this machine;
Lightning adopts them (TorchElasticEnvironment) and the ranks agree on one run directory."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, TINY, ok, ranks_that_joined, run_dirs, summary

pytestmark = pytest.mark.slow

SCRIPTS = REPO / "scripts" / "torchrun"
TIMEOUT_S = 300


def _env(log_dir: Path, **extra: str) -> dict[str, str]:
    # The scripts call `torchrun`, which must be litlab's (the venv's bin may not be on PATH).
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "LITLAB_LOG_DIR": str(log_dir),
        **extra,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_two_ranks_on_one_node_write_one_run_directory(log_dir: Path):
    # scripts/torchrun/single_node.sh with NPROC=2 runs exactly:
    # torchrun --nproc-per-node=2 -m litlab.train trainer.devices=2 strategy=ddp trainer.accelerator=cpu ...
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
    assert len(runs) == 1, runs  # each rank ran Hydra; they agreed on one directory
    (run,) = runs
    result = summary(run)
    assert result["status"] == "completed"
    assert (result["world_size"], result["devices"], result["strategy"]) == (2, 2, "ddp")
    assert result["cluster_environment"] == "TorchElasticEnvironment"  # torchrun's ranks, none from Lightning
    assert ranks_that_joined(run) == ["0 1/2", "1 2/2"]
    assert len(list(log_dir.glob("**/summary.json"))) == 2  # the run dir's and its storage copy


def test_torchrun_two_nodes_train_with_global_rank_zero_alone_writing(tmp_path: Path):
    # Two "nodes" on 127.0.0.1, one process each. Each node gets its own log folder, as machines
    # without a shared disk would: node 1 must end up with the agreed run directory holding its
    # log lines and nothing else.
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
    (node1_run,) = run_dirs(node_logs[1])
    assert node1_run.name == run.name  # both nodes resolved the same run directory
    node1_files = sorted(str(p.relative_to(node_logs[1])) for p in node_logs[1].rglob("*") if p.is_file())
    assert node1_files == [f"train/runs/{run.name}/train.log"]  # no summary, checkpoints, .hydra
    assert ranks_that_joined(run) + ranks_that_joined(node1_run) == ["0 1/2", "1 2/2"]
    assert "[rank 1]" not in (run / "train.log").read_text()
