"""Every command in the README's quick-start and commands blocks works (with tiny settings)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import BIN, REPO, TINY, WARM, command_env, ok, run_dirs

# Tiny runs, and small batches: the README's resnet on 3x32x32 images takes ~1 s a batch of 64 on a CPU.
SMALL = [*TINY, "data.batch_size=16"]


def readme_block(name: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(rf"<!-- {name}:.*?-->\s*```bash\n(.*?)```", text, re.S)
    assert block, f"README has no {name} block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_commands_work(log_dir):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    # `make test ARGS=...` passes ARGS to its commands as an environment variable: no make here takes it
    for name in ("ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(name, None)
    commands = readme_block("quickstart") + readme_block("commands")
    assert "make train" in commands and "make test" in commands
    for command in commands:
        if command == "make test":
            continue  # this test is part of it
        if command == "make train":
            pass  # as typed: the default experiment, whose accuracy the README states (checked below)
        elif "<run>" in command:
            command = command.replace("logs/train/runs/<run>", str(run_dirs(log_dir)[-1]))
        elif "litlab" in command:
            command = f"{command} {' '.join(t for t in SMALL if t.split('=')[0] not in command)}"
        argv = shlex.split(command)
        if argv[0].startswith("litlab-"):  # a console script, found on PATH as the shell finds it
            argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        elif argv[:2] == ["python", "-m"]:  # the warm server runs the module as `python -m` does
            argv = argv[1:]
        if argv[0] != "make":
            # Warm, and so are the ranks it starts (tests/warm.py); make starts cold, as typed.
            result = WARM.run(argv, command_env(env, warm_jobs=True), REPO, timeout=300)
        else:
            result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        ok(result)
        if command == "make train":
            assert_the_default_experiment_reached_90_percent(log_dir)


def assert_the_default_experiment_reached_90_percent(log_dir):
    (run,) = run_dirs(log_dir)
    result = json.loads((run / "summary.json").read_text())
    assert result["status"] == "completed"
    assert result["groups"]["model"] == "cnn" and result["groups"]["data"] == "digits"
    assert result["metrics"]["test/acc"] >= 0.90
    assert (run / "tensorboard").is_dir()
    assert list((run / "checkpoints").glob("*.ckpt"))
