"""What a user sees of a run, as real processes print it: no known noise, warnings of their own code,
a model summary without a FLOPs column of zeros, the last line; checkpoint paths that paste into
``litlab-eval ckpt_path=`` and ``resume=``; Hydra's shell completion in bash; ``make tensorboard``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from litlab.cli import preflight
from tests.conftest import BIN, FAULTS_IMPORTABLE, REPO, TINY, litlab, ok, run_dirs, summary
from tests.faults import MLPThatWarns


def test_a_run_prints_no_known_noise_and_ends_with_its_metrics_and_run_dir(log_dir, monkeypatch):
    tiny = [t for t in TINY if t != "trainer.enable_model_summary=false"]
    result = ok(
        litlab(
            "litlab-train",
            "model=mlp",
            "model.net._target_=tests.faults.MLPThatWarns",
            *tiny,
            env=FAULTS_IMPORTABLE,
            cold=True,  # what the imports print too: a warm start imported torch and Lightning earlier
        )
    )
    output = result.stdout + result.stderr
    assert "💡 Tip" not in output and "LeafSpec" not in output  # Lightning's tips, torch's deprecation
    assert MLPThatWarns.message in result.stderr  # a warning of the user's own code still shows
    assert "model summary:" in output and "FLOPs" not in output and "Flops" not in output
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    metrics = outcome["metrics"]
    last = result.stdout.strip().splitlines()[-1]
    expected = f"val/acc = {metrics['val/acc']:.4g}, test/acc = {metrics['test/acc']:.4g}; run: {run}"
    assert last.endswith(f"[litlab][INFO] {expected}"), last

    # Every checkpoint path summary.json names pastes as it is, into resume= and into ckpt_path=.
    checkpoints = outcome["checkpoints"]
    assert "=" not in checkpoints["best"] and checkpoints["best"] == checkpoints["tested"]
    monkeypatch.chdir(REPO)
    for path in (checkpoints["best"], checkpoints["last"]):
        preflight.check_or_exit("train", [f"resume={path}", *tiny])  # parses, composes, file exists
    evaluated = ok(litlab("litlab-eval", f"ckpt_path={checkpoints['best']}", env=FAULTS_IMPORTABLE))
    (eval_dir,) = run_dirs(log_dir, "eval")
    record = json.loads((eval_dir / "eval.json").read_text())
    assert record["ckpt_path"] == checkpoints["best"]
    tested = record["metrics"]  # on the whole test split (the run tested 2 batches of it)
    last = evaluated.stdout.strip().splitlines()[-1]
    shown = f"test/acc = {tested['test/acc']:.4g}, test/loss = {tested['test/loss']:.4g}"
    assert last.endswith(f"{shown}; eval: {eval_dir / 'eval.json'}"), last


def test_bash_completion_completes_options_and_keys(tmp_path):
    # What TAB runs in bash once the documented line is in ~/.bashrc: eval "$(litlab-train -sc install=bash)"
    script = f"""
        export PATH={shlex.quote(str(BIN))}:$PATH
        eval "$(litlab-train -sc install=bash)"
        complete -p litlab-train
        COMP_LINE="litlab-train precision=bf" COMP_POINT=26 COMP_CWORD=1
        hydra_bash_completion
        printf 'reply %s\\n' "${{COMPREPLY[@]}}"
    """
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=os.environ
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "-F hydra_bash_completion litlab-train" in lines[0]
    assert sorted(line for line in lines if line.startswith("reply ")) == [
        "reply precision=bf16",
        "reply precision=bf16_true",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_make_tensorboard_serves_the_log_folder(tmp_path):
    port = free_port()
    (tmp_path / "logs").mkdir()
    # SETUP= : use the running environment as it is (make would otherwise set up .venv first).
    command = [
        "make",
        "tensorboard",
        f"VENV={sys.prefix}",
        "SETUP=",
        f"PORT={port}",
        f"LOGS={tmp_path / 'logs'}",
    ]
    server = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/logdir", timeout=2) as response:
                    assert json.loads(response.read()) == {"logdir": str(tmp_path / "logs")}
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()
                assert time.monotonic() < deadline, "TensorBoard did not answer"
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert re.search(rb"tensorboard --logdir \S+ --port \d+", server.stdout.read())
