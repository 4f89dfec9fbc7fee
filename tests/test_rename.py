"""``make rename NAME=...`` turns a copy of the template into a working project of another name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY, ok, run_dirs, summary


def copy_of_the_project(target: Path) -> Path:
    """The project's own files (what git tracks, plus new files git does not ignore), in ``target``."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = [name for name in listed.split("\0") if name and (REPO / name).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        ignored = shutil.ignore_patterns(".git", ".venv", "logs", "__pycache__", "*.egg-info", ".*_cache")
        shutil.copytree(REPO, target, ignore=ignored)
        return target
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    return target


def make_rename(project: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "rename", f"NAME={name}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )


def file_contents(project: Path) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(project.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_renamed_copy_has_no_trace_of_the_old_name_and_trains(tmp_path: Path):
    project = copy_of_the_project(tmp_path / "fork")
    ok(make_rename(project, "myproject"))

    assert (project / "src" / "myproject" / "train.py").is_file()
    assert not (project / "src" / "litlab").exists()
    leftovers = [name for name, data in file_contents(project).items() if b"litlab" in data.lower()]
    assert not leftovers, leftovers
    pyproject = (project / "pyproject.toml").read_text()
    assert 'name = "myproject"' in pyproject
    assert 'myproject-train = "myproject.train:main"' in pyproject
    assert (project / "README.md").read_text().startswith("# myproject\n")
    assert "_target_: myproject.data.digits." in (project / "configs" / "data" / "digits.yaml").read_text()

    # The copy runs on this test's environment with its own source first on the path. A venv of
    # its own (make setup) would cost minutes and downloads; console scripts of the new name exist
    # only after that install, so the training below runs the module, as `myproject-train` would.
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PYTHONUNBUFFERED": "1"}
    env.pop("LITLAB_LOG_DIR", None)
    env["MYPROJECT_LOG_DIR"] = str(tmp_path / "logs")  # the renamed environment variable
    fast_subset = ["tests/test_configs.py", "-k", "documented_options or model-cnn or data-digits"]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *fast_subset],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ok(tests)
    assert " passed" in tests.stdout and " failed" not in tests.stdout
    trained = subprocess.run(
        [sys.executable, "-m", "myproject.train", *TINY],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ok(trained)
    (run,) = run_dirs(tmp_path / "logs")
    assert summary(run)["status"] == "completed"
    assert "[myproject]" in (run / "train.log").read_text()  # the package's logger has the new name


@pytest.mark.parametrize("bad_name", ["", "My-Project", "torch", "lightning", "os", "litlab"])
def test_rename_refuses_a_bad_name_and_changes_nothing(bad_name: str, tmp_path: Path):
    project = copy_of_the_project(tmp_path / "fork")
    before = file_contents(project)
    result = make_rename(project, bad_name)
    assert result.returncode != 0
    (message,) = [line for line in result.stderr.splitlines() if line.startswith("rename: error:")]
    assert f"NAME={bad_name}" in message or "make rename NAME=" in message
    assert file_contents(project) == before
