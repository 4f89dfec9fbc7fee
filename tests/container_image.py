"""The container image, built and run with podman: ``make test-image`` (after ``make test`` in CI).

Not collected by ``make test`` (the file's name is not ``test_*.py``): a build installs torch into
the image, minutes of work. It builds the Dockerfile through ``make image`` on a Debian bookworm base
made here from Debian's packages (``nvidia/cuda`` cannot be pulled on a test machine), then trains in
it as its non-root user with a read-only root filesystem, kills it, starts it again and checks that
it resumed. The build's pip reads a wheel folder that this machine's pip fills first, with its own
settings (torch from the machine's package index where it has one, PyPI otherwise; its constraints
and CA bundle): the build itself reaches no package index. Skipped only where podman cannot run.
Times and sizes measured here: docs/cloud.md, section 2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# runc where it is installed: crun, podman's other runtime, refuses cgroups v1 in hybrid mode (some VMs).
PODMAN = ["podman", "--runtime", "runc"] if shutil.which("runc") else ["podman"]
# Limits podman can set everywhere (its defaults, above the host's hard limits, are refused on some VMs).
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]
BASE = "localhost/debian:bookworm-min"
BASE_PYTHON = (3, 11)  # bookworm's python3, which the Dockerfile installs
IMAGE = "localhost/litlab-test"
APP = "/home/litlab/app"  # the image's WORKDIR; logs/ in it is the volume
# Nothing cached (the Debian base made, torch from PyPI): 10 min here (docs/cloud.md); warm: 1 to 2.5.
COLD_LIMIT_S = 25 * 60
TRAIN = [
    "model=mlp",
    "trainer.max_epochs=1",
    "data.batch_size=16",  # 79 steps: the epoch outlasts the wait for its first checkpoint
    "callbacks.checkpoint.every_n_train_steps=10",
]


def pip_extras(dockerfile: Path = REPO / "Dockerfile") -> str:
    """The extras the Dockerfile installs litlab with, as written there (``s3,gcs,...``)."""
    match = re.search(r"pip install '\./\[([\w,]+)\]'", dockerfile.read_text())
    assert match, f"{dockerfile.name}: no pip install './[extras]'"
    return match.group(1)


def run(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"{shlex.join(result.args)}: rc {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def make_debian_base(folder: Path) -> None:
    """BASE from Debian's packages: debootstrap's minimal bookworm, imported into podman (a minute)."""
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.fail(
            f"{BASE} is missing and cannot be made: it needs debootstrap and root (.ci/run installs it)"
        )
    ok(
        run(
            ["debootstrap", "--variant=minbase", "bookworm", str(folder), "http://deb.debian.org/debian"], 900
        )
    )
    tar = subprocess.Popen(["tar", "-C", str(folder), "-c", "."], stdout=subprocess.PIPE)
    ok(run([*PODMAN, "import", "-", BASE], 600, stdin=tar.stdout))
    assert tar.wait() == 0


@pytest.fixture(scope="module")
def base_image(tmp_path_factory) -> str:
    """BASE, made once per machine (podman keeps it); skips where podman cannot run a container."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (.ci/run installs podman, runc and debootstrap)")
    info = run([*PODMAN, "info"], 120)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {info.stderr.strip().splitlines()[-1:]}")
    if run([*PODMAN, "image", "exists", BASE], 60).returncode != 0:
        make_debian_base(tmp_path_factory.mktemp("debian") / "root")
    probe = run([*PODMAN, "run", "--rm", *LIMITS, BASE, "true"], 120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {probe.stderr.strip().splitlines()[-1:]}")
    return BASE


@pytest.fixture(scope="module")
def image(base_image, tmp_path_factory) -> str:
    """IMAGE, built by ``make image`` on the Debian base from a wheel folder this machine's pip fills."""
    flags = []
    if sys.version_info[:2] == BASE_PYTHON:  # else the build's pip downloads what it installs
        wheels = tmp_path_factory.mktemp("wheels")
        import tomllib  # Python 3.11 here (BASE_PYTHON)

        build_requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
        ok(run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels),
                f"{REPO}[{pip_extras()}]", *build_requirements], COLD_LIMIT_S))  # fmt: skip
        (wheels / "pip.conf").write_text("[global]\nno-index = true\nfind-links = /mnt\n")
        wheels.chmod(0o755)  # the build's user reads it (pytest makes its folders for their owner alone)
        # /mnt exists in every base: a mount there leaves no mount point behind in a layer.
        flags = ["-v", f"{wheels}:/mnt:ro", "--build-arg", "PIP_CONFIG_FILE=/mnt/pip.conf"]
    make = ["make", "-C", str(REPO), "image", f"IMAGE={IMAGE}", f"BASE={base_image}"]
    make += [f"CONTAINER={shlex.join(PODMAN)}", f"IMAGE_BUILD_FLAGS={shlex.join(flags)}"]
    try:
        ok(run(make, COLD_LIMIT_S))
    finally:
        if flags:
            shutil.rmtree(wheels)  # gigabytes; pip's cache and the machine's index keep what it took
    return IMAGE


def newest_checkpoint(logs: Path) -> Path | None:
    return next(iter(logs.glob("train/runs/*/checkpoints/last.ckpt")), None)


@pytest.mark.timeout(COLD_LIMIT_S)
def test_image_trains_as_its_user_into_a_volume_resumes_after_a_kill_and_writes_nothing_into_its_layers(
    image, tmp_path
):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)  # the image's user writes it (uid 1000, or a sub-uid under rootless podman)
    user = ok(run([*PODMAN, "image", "inspect", "--format", "{{.Config.User}}", image], 60)).stdout.strip()
    assert user == "1000:1000", user
    name = f"litlab-test-{os.getpid()}"
    # A read-only root: the image's layers cannot be written; /tmp and the volume are all it may write.
    container = [
        *LIMITS,
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs",
        "/tmp",
        "-v",
        f"{logs}:{APP}/logs",
    ]
    try:
        ok(run([*PODMAN, "run", "--detach", "--name", name, *container, image, *TRAIN], 120))
        deadline = time.monotonic() + 600
        while newest_checkpoint(logs) is None:
            state = ok(run([*PODMAN, "inspect", "--format", "{{.State.Status}}", name], 60)).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                pytest.fail(
                    f"no checkpoint, the run is {state}:\n{run([*PODMAN, 'logs', name], 60).stderr[-3000:]}"
                )
            time.sleep(0.2)
        ok(run([*PODMAN, "kill", name], 60))  # SIGKILL: no preempted.ckpt, no time to clean up
        killed = ok(run([*PODMAN, "wait", name], 120)).stdout.strip()
        assert killed == "137", f"the run ended before it was killed (exit {killed}): make its epoch longer"
        (run_dir,) = logs.glob("train/runs/*/")

        # The same container started again, as a restart policy does: the same command, resumed.
        second = run([*PODMAN, "start", "--attach", name], 600)
        output = second.stdout + second.stderr
        assert second.returncode == 0, output[-3000:]
        (resumed,) = re.findall(r"resuming from (\S+) \(epoch 0, step (\d+)\)", output)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["status"], summary["resumed_count"]) == ("completed", 1), summary
        assert 10 <= int(resumed[1]) < summary["global_step"], (resumed, summary["global_step"])
        assert resumed[0].startswith(f"{APP}/logs/train/runs/"), resumed  # from the volume
        # Written by the image's user: not the container's root, which is this user on the host.
        assert os.geteuid() not in {path.stat().st_uid for path in logs.rglob("*")}
        # What podman itself writes into every container it starts (/etc/mtab), and nothing more.
        reference = [*PODMAN, "run", "--name", f"{name}-idle", *container, "--entrypoint", "true", image]
        ok(run(reference, 120))
        idle = ok(run([*PODMAN, "diff", f"{name}-idle"], 60)).stdout.split()
        assert ok(run([*PODMAN, "diff", name], 60)).stdout.split() == idle, (
            "the run wrote into the image's layers"
        )

        # The other commands through the entry point: eval and predict on the checkpoint in the volume.
        checkpoint = f"logs/{newest_checkpoint(logs).relative_to(logs)}"
        for command, result in (
            ("litlab-eval", "eval/**/eval.json"),
            ("litlab-predict", "predict/**/predictions.csv"),
        ):
            ok(run([*PODMAN, "run", "--rm", *container, image, command, f"ckpt_path={checkpoint}"], 600))
            assert list(logs.glob(result)), f"{command} wrote no {result}"
    finally:
        run([*PODMAN, "rm", "--force", name, f"{name}-idle"], 120)
