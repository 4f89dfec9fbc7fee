"""Shared test helpers: isolated log folders, configs composed in-process, and litlab commands run
as real subprocesses.

tests/unit/ runs in-process (``make test-fast``); tests/integration/ starts real processes (training
runs, DDP ranks, sweeps, torchrun, Slurm, the S3 server).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR, ENGINE_CONFIG_DIR
from tests.azurite_server import azure_server  # noqa: F401  (a fixture: Azurite on 127.0.0.1)
from tests.gcs_server import gcs_server  # noqa: F401  (a fixture: gcp-storage-emulator on 127.0.0.1)
from tests.object_stores import object_store  # noqa: F401  (each object store's server in turn)
from tests.s3_server import s3_server  # noqa: F401  (a fixture: moto_server on 127.0.0.1)
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (a real single-node Slurm, session-scoped)
from tests.warm import WarmProcess, WarmStarts

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# For litlab subprocesses that train a network from tests.faults: they import it from the repository.
FAULTS_IMPORTABLE = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}

# The seed of every random choice a test makes (kill points): printed in pytest's header, and
# LITLAB_TEST_SEED=<seed> replays a failure.
TEST_SEED = int(os.environ.get("LITLAB_TEST_SEED") or random.SystemRandom().randrange(2**32))
os.environ["LITLAB_TEST_SEED"] = str(TEST_SEED)  # pytest-xdist's workers, started later, draw the same
# No test machine is a cloud VM: the AWS and Google credential chains would otherwise ask a metadata
# server that is not there, and wait for it (14 s per GCS filesystem made without credentials).
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("NO_GCE_CHECK", "true")
# One intra-op thread per torch process: the tests' processes are tiny runs, two xdist workers start
# them side by side (DDP tests two ranks each), and torch's default of a thread per core
# oversubscribes the cores, whose OpenMP threads then spin waiting for each other (measured on 2
# cores: the DDP and resume tests took 74-80 s with the default, 58-61 s with one thread). The device
# pool's own OMP_NUM_THREADS per job is unchanged (it takes the smaller of its cores and this).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_report_header() -> str:
    return f"litlab: LITLAB_TEST_SEED={TEST_SEED} (random test choices; set it to replay them)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow tests (several processes each) first, then the other integration files (a
    process or a server each), then the in-process unit tests. pytest-xdist hands whole files to its
    workers in this order (make test: --dist loadfile --no-loadscope-reorder), so the quick files fill
    the end of the run on every worker, instead of one slow file running last while the others idle."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    unit = Path(__file__).parent / "unit"
    # Stable: the order within each part stays.
    items.sort(key=lambda item: (item.path not in slow_files, item.path.is_relative_to(unit)))


# Tiny settings: a few batches of the digits, so a Lightning process costs its imports and little more.
TINY = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_model_summary=false",
    "logger=csv",
]


# Where config groups are read from: the fork's configs/, then the engine's (litlab/conf).
CONFIG_DIRS = [CONFIG_DIR, ENGINE_CONFIG_DIR]


def option_names(group: str) -> list[str]:
    """The options of a config group: its YAML files in configs/ and in the engine's groups."""
    return sorted({p.stem for folder in CONFIG_DIRS for p in (folder / group).glob("*.yaml")})


def config_groups() -> set[str]:
    """The config groups of configs/ and of the engine (their folders; configs/local is gitignored)."""
    return {p.name for folder in CONFIG_DIRS for p in folder.iterdir() if p.is_dir() and p.name != "local"}


def compose_train(overrides: list[str], output_dir: Path, config_name: str = "train") -> DictConfig:
    """configs/train.yaml with the overrides, as litlab-train composes it, with Hydra's runtime set
    (so ``${hydra:...}`` resolves) to ``output_dir``."""
    schema.register()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    return cfg


def train_in_process(tmp_path: Path, *overrides: str, name: str = "run") -> dict:
    """One run in this process, as litlab-train runs it (``litlab.train``), with its run directory
    ``tmp_path/name`` and logs and storage under ``tmp_path/logs``: its summary.json."""
    import litlab

    where = [f"paths.log_dir={tmp_path / 'logs'}", f"hydra.run.dir={tmp_path / name}"]
    return litlab.train([*where, *overrides])


def logged(run_dir: Path, text: str, level: str = "") -> list[str]:
    """The messages of the run's train.log lines that contain ``text`` (at ``level``, e.g. WARNING),
    without the lines' ``[time][rank][logger][level]`` prefix."""
    lines = (run_dir / "train.log").read_text().splitlines()
    return [line.split("] ", 1)[-1] for line in lines if text in line and f"[{level}" in line]


@pytest.fixture
def log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private logs/ folder for the test (litlab reads LITLAB_LOG_DIR)."""
    path = tmp_path / "logs"
    monkeypatch.setenv("LITLAB_LOG_DIR", str(path))
    return path


# Console scripts started by tests are forked from a server that has imported torch, Lightning and
# Hydra (tests/warm.py): a real process of its own, minus ~5 s of imports; so are the sweep jobs and
# DDP ranks those start. cold=True for a test of what happens while a process starts.
WARM = WarmStarts()


def command_env(env: dict[str, str] | None = None, warm_jobs: bool = False) -> dict[str, str]:
    """The environment of a litlab command a test starts: this process's, unbuffered, plus ``env``.
    ``warm_jobs``: its sweep jobs' processes start warm too (tests/warm_jobs/sitecustomize.py)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    if warm_jobs:
        full_env["LITLAB_TEST_WARM_JOBS"] = WARM.job_servers()
        path = [str(REPO / "tests" / "warm_jobs"), full_env.get("PYTHONPATH")]
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    else:
        full_env.pop("LITLAB_TEST_WARM_JOBS", None)
    return full_env


def litlab(
    command: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path = REPO,
    cold: bool = False,
) -> subprocess.CompletedProcess:
    """Run a litlab console script (litlab-train, litlab-eval, litlab-compare) and capture its output."""
    argv = [str(BIN / command), *args]
    if not cold:
        return WARM.run(argv, command_env(env, warm_jobs=True), cwd, timeout)
    return subprocess.run(
        argv, capture_output=True, text=True, env=command_env(env), timeout=timeout, cwd=cwd
    )


def start_litlab(
    command: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    new_session: bool = False,
    merge_stderr: bool = True,
) -> WarmProcess:
    """Start a litlab console script, warm, with its output in ``.stdout`` (text; stderr too, or in
    ``.stderr`` with ``merge_stderr=False``): a ``subprocess.Popen``-like process (pid, poll, wait,
    send_signal, kill, communicate)."""
    return WARM.popen(
        [str(BIN / command), *args],
        command_env(env, warm_jobs=True),
        cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        start_new_session=new_session,
    )


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Assert a command succeeded, showing its output tail when it did not."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def run_dirs(log_dir: Path, task: str = "train") -> list[Path]:
    """The folders of the runs started under ``<log dir>/<task>/runs/`` (each has Hydra's .hydra/), but
    those resume=never set aside."""
    runs = log_dir / task / "runs"
    return sorted(p for p in runs.glob("*") if (p / ".hydra").is_dir() and ".replaced-" not in p.name)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def ranks_that_joined(run_dir: Path) -> list[str]:
    """Lightning's "Initializing distributed" lines in train.log, as "<global rank> <member>/<world>":
    exactly one per rank of one process group, whoever launched the ranks."""
    marker = "Initializing distributed: GLOBAL_RANK: "
    lines = (run_dir / "train.log").read_text().splitlines()
    return sorted(line.split(marker)[1].replace(", MEMBER:", "") for line in lines if marker in line)
