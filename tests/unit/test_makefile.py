"""The Makefile's own help: ``make help`` lists every target a user can run."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target():
    makefile = (REPO / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY: (.+)$", makefile, re.M)
    # help needs no .venv, so this runs make itself, not a copy of its grep.
    result = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[1] for line in result.stdout.splitlines() if line.strip().startswith("make ")}
    assert set(phony.split()) <= listed, f"make help does not list {set(phony.split()) - listed}"
    for target in ("test-fast", "lint", "bench", "clean"):  # the ones README.md names
        assert target in listed


def tensorboard_command(logs: Path, port: int) -> list[str]:
    """The command ``make tensorboard LOGS=<logs> PORT=<port>`` runs, as make prints it (``-n``) without
    running it; ``SETUP=`` leaves the environment as it is."""
    make = ["make", "-n", "-s", "tensorboard", "SETUP=", f"LOGS={logs}", f"PORT={port}"]
    result = subprocess.run(make, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    return shlex.split(line)


def folders_tensorboard_reads(command: list[str]) -> list[Path]:
    """The folders of event files TensorBoard started as ``command`` reads: its own parsing of the
    command and its own walk of each log directory (which follows links)."""
    from tensorboard import program
    from tensorboard.backend.event_processing import data_ingester, io_wrapper
    from tensorboard.plugins.core import core_plugin

    server = program.TensorBoard(plugins=[core_plugin.CorePluginLoader])  # it defines the log flags
    server.configure(argv=command)
    flags = server.flags
    # The log directories as TensorBoard's data ingester takes them from --logdir or --logdir_spec.
    roots = [flags.logdir] if flags.logdir else list(data_ingester._parse_event_files_spec(flags.logdir_spec))
    return [Path(folder) for root in roots for folder in io_wrapper.GetLogdirSubdirectories(root)]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_tensorboard_shows_each_run_once_though_a_sweep_links_its_jobs_runs(tmp_path):
    logs = tmp_path / "logs"
    trained = logs / "train" / "runs" / "default-1a2b3c4d5e" / "tensorboard"
    evaluated = logs / "eval" / "runs" / "2026-12-01_10-00-00_1a2b3c" / "tensorboard"
    for events in (trained, evaluated):
        events.mkdir(parents=True)
        (events / "events.out.tfevents.1796400000.host.1.0").touch()
    sweep = logs / "train" / "multiruns" / "2026-12-01_09-00-00_4d5e6f"
    sweep.mkdir(parents=True)
    (sweep / "0").symlink_to(Path("..", "..", "runs", trained.parent.name))  # the sweep's job 0
    (logs / "bench").mkdir()  # a folder with no runs/: not every task folder has one

    command = tensorboard_command(logs, port=6007)
    assert command[0].endswith("/bin/tensorboard") and command[command.index("--port") + 1] == "6007"
    read = Counter(folder.resolve() for folder in folders_tensorboard_reads(command))
    assert read == {trained.resolve(): 1, evaluated.resolve(): 1}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_tensorboard_before_any_run_watches_the_whole_log_folder(tmp_path):
    (tmp_path / "logs").mkdir()
    command = tensorboard_command(tmp_path / "logs", port=6006)
    assert command[1:] == ["--logdir", str(tmp_path / "logs"), "--port", "6006"]
