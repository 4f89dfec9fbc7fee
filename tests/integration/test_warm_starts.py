"""The warm starts the tests use (tests/warm.py) give a process what a cold start gives it: the same
arguments, environment, working directory, script directory on sys.path, session, output and exit
status, and the same run of litlab-train, line for line and number for number."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import TINY, WARM, command_env, litlab, run_dirs, summary

PROBE = """
    import json, os, sys
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "seed": os.environ.get("PROBE_SEED"),
        "session_leader": os.getsid(0) == os.getpid(),
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
"""


def test_a_warm_child_gets_the_arguments_environment_session_and_exit_of_a_cold_process(tmp_path):
    script = tmp_path / "bin" / "probe"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(PROBE))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = command_env({"PROBE_SEED": "7"})
    argv = [str(script), "3", "x=1"]
    cold = subprocess.run(
        [sys.executable, *argv], env=env, cwd=workdir, capture_output=True, text=True, start_new_session=True
    )
    warm = WARM.popen(
        argv, env, workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    out, err = warm.communicate(timeout=60)
    assert (warm.returncode, err) == (cold.returncode, cold.stderr) == (3, "to stderr\n")
    expected = {
        "argv": argv,
        "cwd": str(workdir),
        "path0": str(script.parent),
        "seed": "7",
        "session_leader": True,
    }
    assert json.loads(out) == json.loads(cold.stdout) == expected


def test_a_warm_child_ends_by_a_signal_as_a_cold_process_does(tmp_path):
    script = tmp_path / "sleeper"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    child = WARM.popen([str(script)], command_env(), tmp_path, stdout=subprocess.PIPE)
    assert child.stdout.readline() == "up\n"
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    child.stdout.close()


def normalized(text: str, log_dir: Path) -> str:
    """Output without what differs between any two runs: times, run directory suffixes, pids."""
    text = text.replace(str(log_dir), "<logs>")
    text = re.sub(r"\d{4}-\d\d-\d\d[ _]\d\d[:-]\d\d[:-]\d\d(?:,\d+)?(?:_[0-9a-f]{7})?", "<time>", text)
    text = re.sub(r"\d+(?:\.\d+)? (?:samples/s|s per epoch|s\b)", "<seconds>", text)
    return re.sub(r"pid \d+", "pid <n>", text)


def test_a_ddp_run_started_warm_prints_and_trains_exactly_as_one_started_cold(tmp_path):
    # The command starts warm, and Lightning starts its rank 1 as the command with LOCAL_RANK=1: from
    # a warm command, a warm child that its stand-in process stands for (tests/warm_jobs/
    # sitecustomize.py); from a cold one, cold. Both ranks write to the same stdout and stderr, so
    # their lines interleave in any order: the outputs are compared as sorted lines.
    outcomes = {}
    for start in ("cold", "warm"):
        log_dir = tmp_path / start
        result = litlab(
            "litlab-train",
            "model=mlp",
            "trainer.devices=2",
            "strategy=ddp",
            *TINY,
            env={"LITLAB_LOG_DIR": str(log_dir)},
            cold=start == "cold",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        (run,) = run_dirs(log_dir)
        rank_1 = [normalized(line, log_dir) for line in (run / "train.log").read_text().splitlines()]
        outcomes[start] = (
            sorted(normalized(result.stdout, log_dir).splitlines()),
            sorted(normalized(result.stderr, log_dir).splitlines()),
            [line for line in rank_1 if "[rank 1]" in line],
            summary(run)["metrics"],
        )
    assert outcomes["warm"][2], "rank 1 wrote no line"
    assert outcomes["warm"] == outcomes["cold"]
    folder = Path(WARM.job_servers().rsplit(":", 1)[0])
    assert list(folder.glob("jobs-*.sock")), "no rank was handed to a job server"


def test_a_warm_child_reads_its_rank_from_its_own_environment_whoever_started_the_server(tmp_path):
    """Lightning reads a process's rank from the environment once, at import: in a job server, with
    the environment of the job that started it. A server started by a DDP rank 1 (LOCAL_RANK=1) made
    every later child rank 1 until its Trainer said otherwise: a sweep job's W&B experiment was then
    Lightning's dummy, and its final metrics failed ('function' object has no attribute 'update')."""
    import os

    import psutil

    (tmp_path / "rank_probe.py").write_text(
        "from lightning.fabric.utilities.rank_zero import rank_zero_only\nprint(rank_zero_only.rank)\n"
    )
    setting = f"{tmp_path}:{os.getpid()}"  # a server of this test's own
    hand_over = f"import tests.warm as w; w.run_job_warm({setting!r}, ['-m', 'rank_probe'])"
    base = {k: v for k, v in command_env().items() if k not in ("LOCAL_RANK", "RANK", "LITLAB_SWEEP_JOB")}
    base["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    try:
        ranks = [
            subprocess.run(
                [sys.executable, "-c", hand_over],
                env={**base, **extra},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )  # fmt: skip
            for extra in ({"LOCAL_RANK": "1"}, {"LITLAB_SWEEP_JOB": "1"})
        ]
        printed = [(r.returncode, r.stdout) for r in ranks]
        assert printed == [(0, "1\n"), (0, "0\n")], [r.stderr for r in ranks]
        assert list(tmp_path.glob("jobs-*.sock")), "both ran warm, through the one server"
    finally:
        for process in psutil.process_iter(["cmdline"]):
            if any(str(tmp_path) in part for part in process.info["cmdline"] or []):
                process.kill()
