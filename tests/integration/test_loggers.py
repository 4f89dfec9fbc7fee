"""MLflow and W&B, for real: a two-job sweep logs to both at once (``logger=[mlflow,wandb]``).

MLflow: an ``mlflow server`` on 127.0.0.1 that the test starts, read back through MLflow's client.
W&B: offline mode (``WANDB_MODE=offline``), read back from the run files it writes (the records of
``run-<id>.wandb``, decoded with wandb's own protobuf classes). Nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BIN, TINY, litlab, ok

pytest.importorskip("mlflow")
pytest.importorskip("wandb")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on a free port of 127.0.0.1; yields its URL."""
    port = free_port()
    store = tmp_path / "mlflow-server"
    store.mkdir()
    command = [
        str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", str(store / "runs"), "--default-artifact-root", str(store / "artifacts"),
    ]  # fmt: skip
    # A file store: it starts in a few seconds where SQLite's schema migrations take ten more (on the
    # server side only; litlab's own default is SQLite). MLflow asks for this opt-in to use it.
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    log = (store / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the worker it started
        server.wait(timeout=30)
        log.close()


def wait_until_up(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (a LevelDB-style log: 7-byte header, 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first, or middle/last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_a_sweep_logs_config_metrics_and_final_metrics_to_mlflow_and_wandb_grouped_by_sweep(
    log_dir, mlflow_server
):
    tiny = [
        t for t in TINY if not t.startswith(("logger=", "trainer.max_epochs", "trainer.limit_train_batches"))
    ]
    tiny.append("trainer.limit_train_batches=6")  # accumulation 2: 6 steps, the last timed after 5 warm-up
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10"}
    env["OMP_NUM_THREADS"] = (
        "1"  # what is under test is the logging; one thread trains fastest beside a server
    )
    # Started right after the server: both spend their first seconds importing.
    result = litlab(
        "litlab-train",
        "-m",
        "logger=[mlflow,wandb]",
        f"logger.mlflow.tracking_uri={mlflow_server}",
        "trainer.accumulate_grad_batches=1,2",
        "trainer.max_epochs=2",
        *tiny,
        env=env,
    )
    ok(result)
    wait_until_up(mlflow_server)
    (sweep_dir,) = (log_dir / "train" / "multiruns").iterdir()
    summaries = [json.loads((sweep_dir / str(job) / "summary.json").read_text()) for job in (0, 1)]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("default")  # experiment_name
    runs = client.search_runs([experiment.experiment_id], order_by=["tags.sweep_job ASC"])
    assert len(runs) == 2
    for job, (run, summary) in enumerate(zip(runs, summaries, strict=True)):
        assert run.info.status == "FINISHED"
        assert run.data.tags["sweep"] == sweep_dir.name and run.data.tags["sweep_job"] == str(job)
        assert run.info.run_name == f"{sweep_dir.name}/{job}"
        # The resolved config as parameters (flattened by Lightning with "/").
        assert run.data.params["trainer/accumulate_grad_batches"] == str(job + 1)
        assert run.data.params["model/_target_"] == "project.vision.module.ImageClassifier"
        assert run.data.params["optimized_metric"] == "val/acc"
        # Every metric the run logged, epoch by epoch, and the final ones.
        logged = [m.value for m in client.get_metric_history(run.info.run_id, "val/acc")]
        assert logged == pytest.approx([entry["metrics"]["val/acc"] for entry in summary["history"]])
        for name, value in summary["metrics"].items():
            assert run.data.metrics[f"final/{name}"] == pytest.approx(value)
        assert {"train/loss", "val/loss", "test/acc", "throughput/samples_per_second"} <= set(
            run.data.metrics
        )

    for job, summary in enumerate(summaries):
        (run_file,) = (sweep_dir / str(job) / "wandb").glob("offline-run-*/run-*.wandb")
        records = wandb_records(run_file)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_group == sweep_dir.name and run.display_name == f"{sweep_dir.name}/{job}"
        config = {
            item.key: json.loads(item.value_json)
            for r in records
            if r.WhichOneof("record_type") == "config"
            for item in r.config.update
        }
        assert config["trainer"]["accumulate_grad_batches"] == job + 1
        history = [
            {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in r.history.item}
            for r in records
            if r.WhichOneof("record_type") == "history"
        ]
        assert [h["val/acc"] for h in history if "val/acc" in h] == pytest.approx(
            [entry["metrics"]["val/acc"] for entry in summary["history"]]
        )
        final = {
            "/".join(item.nested_key) or item.key: json.loads(item.value_json)
            for r in records
            if r.WhichOneof("record_type") == "summary"
            for item in r.summary.update
        }
        assert final["final/test/acc"] == pytest.approx(summary["metrics"]["test/acc"])
        assert any(r.WhichOneof("record_type") == "exit" and r.exit.exit_code == 0 for r in records)
