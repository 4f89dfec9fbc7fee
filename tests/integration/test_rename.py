"""``make rename NAME=...`` renames your package only, a fork keeps merging the engine's fixes, and a
plain ``pip install .`` of it trains from any directory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, TINY, ok, run_dirs, summary

# A reference to the package `project` in code or config (what the rename must leave none of).
OLD_REFERENCE = re.compile(r"(?<![\w.])project\.(vision|schedules|char_lm)\b|from project\b|import project\b")


def copy_of_the_project(target: Path) -> Path:
    """The project's own files (what git tracks, plus new files git does not ignore), in ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in (n for n in listed.split("\0") if n and (REPO / n).exists()):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # src/litlab_configs -> ../configs
            (target / name).symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
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


def file_contents(project: Path, under: str = "") -> dict[str, bytes]:
    base = project / under
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def train(project: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "litlab.cli.train", *overrides, *TINY],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def installed_plainly(project: Path, tmp_path: Path) -> dict[str, str]:
    """``pip install .`` of ``project``, not editable, into a folder of its own (this test's
    environment provides the dependencies: a venv of its own would cost minutes); the environment
    that runs it, whose LITLAB_LOG_DIR is unset so that logs/ is the working directory's."""
    wheels, target = tmp_path / "wheels", tmp_path / "installed"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    ok(subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."],
                      cwd=project, capture_output=True, text=True, timeout=120))  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    ok(subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                      capture_output=True, text=True, timeout=120))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("LITLAB_LOG_DIR", "PYTHONPATH")}
    return {**env, "PYTHONPATH": str(target)}


def git(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    return ok(
        subprocess.run(["git", *args], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    )


def check_the_rename(project: Path, engine_before: dict[str, bytes]) -> None:
    """What ``make rename NAME=myproject`` must have done to ``project``: your package renamed and every
    reference to it, the engine untouched."""
    assert (project / "src" / "myproject" / "vision" / "module.py").is_file()
    assert not (project / "src" / "project").exists()
    assert file_contents(project, "src/litlab") == engine_before  # the engine is not touched
    about_the_rename = ("scripts/rename.py", "tests/integration/test_rename.py")  # they name the old name
    leftovers = [
        name for name, data in file_contents(project).items()
        if name.endswith((".py", ".yaml")) and name not in about_the_rename
        and OLD_REFERENCE.search(data.decode(errors="ignore"))
    ]  # fmt: skip
    assert not leftovers, leftovers
    assert (
        "_target_: myproject.vision.data.DigitsDataModule"
        in (project / "configs/data/digits.yaml").read_text()
    )
    assert 'OLD = "myproject"' in (project / "scripts" / "rename.py").read_text()  # it can rename again


# What a fork typically commits: its own model and dataset, edits to the example task, an
# experiment, another default in train.yaml, and an option of its own in an engine group.
FORK_FILES = {
    "src/myproject/vision/wide.py": '''
"""A wider MLP: the fork's own network."""

from myproject.vision.nets import MLP


class WideMLP(MLP):
    def __init__(self, image_shape, num_classes, width: int = 256, dropout: float = 0.0) -> None:
        super().__init__(image_shape, num_classes, hidden_sizes=(width,), dropout=dropout)
''',
    "configs/model/wide.yaml": """
_target_: myproject.vision.module.ImageClassifier
_recursive_: false
net:
  _target_: myproject.vision.wide.WideMLP
  width: 96
optimizer: ${optimizer}
scheduler: ${scheduler}
""",
    "src/myproject/vision/blobs.py": '''
"""The fork's own dataset: two Gaussian blobs as 1x4x4 images."""

import torch

from myproject.vision.data import InMemoryImages


class BlobsDataModule(InMemoryImages):
    image_shape = (1, 4, 4)
    num_classes = 2

    def __init__(self, num_samples: int = 400, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_samples = num_samples

    def load(self):
        generator = torch.Generator().manual_seed(0)
        labels = torch.randint(2, (self.num_samples,), generator=generator)
        images = torch.randn(self.num_samples, 1, 4, 4, generator=generator) + labels.view(-1, 1, 1, 1) * 2.0
        return images, labels
''',
    "configs/data/blobs.yaml": """
_target_: myproject.vision.blobs.BlobsDataModule
num_samples: 400
batch_size: 32
""",
    "configs/trainer/fork.yaml": """
# The engine's trainer defaults, and this fork's own logging interval.
defaults:
  - default
  - _self_
log_every_n_steps: 3
""",
    "configs/experiment/blobs_wide.yaml": """
# @package _global_
defaults:
  - override /data: blobs
  - override /model: wide
  - override /trainer: fork
experiment_name: blobs_wide
""",
}


def test_a_fork_merges_upstream_without_conflicts_and_its_plain_install_trains_anywhere(tmp_path: Path):
    project = copy_of_the_project(tmp_path / "fork")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "the template")
    git(project, "branch", "upstream")

    # The fork: rename, its own model and dataset, an edited example, an experiment, a new default.
    engine_before = file_contents(project, "src/litlab")
    ok(make_rename(project, "myproject"))
    check_the_rename(project, engine_before)
    for name, text in FORK_FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text.lstrip())
    module = project / "src/myproject/vision/module.py"
    module.write_text(
        module.read_text().replace(
            "self.loss = nn.CrossEntropyLoss()", "self.loss = nn.CrossEntropyLoss(label_smoothing=0.0)"
        )
    )
    train_yaml = project / "configs/train.yaml"
    train_yaml.write_text(train_yaml.read_text().replace("\nseed: 42\n", "\nseed: 7\n"))
    git(project, "add", "-A")
    git(project, "commit", "-qm", "my task")

    # Upstream: a fix in the engine (here: a new line in every run's log), a changed engine config
    # option, a docs page and an engine test, each its own commit.
    git(project, "checkout", "-q", "upstream")
    upstream = {
        "src/litlab/run/lifecycle.py": (
            '    log.info("run %s in %s (checkpoints: %s)", identity, run_dir, run.checkpoint_dir)\n',
            '    log.info("engine fix from upstream is here")\n',
        ),
        "src/litlab/conf/trainer/default.yaml": ("gradient_clip_val: null\n", "gradient_clip_val: 7.5\n"),
        "docs/configs.md": ("## Where the groups live\n", "\nA sentence upstream added.\n"),
        "tests/unit/test_layers.py": ("from __future__ import annotations\n", "\nUPSTREAM_ADDED = True\n"),
    }
    for name, (anchor, added) in upstream.items():
        path = project / name
        text = path.read_text()
        assert anchor in text, name
        new = (
            text.replace(anchor, added, 1)
            if name.endswith(".yaml")
            else text.replace(anchor, anchor + added, 1)
        )
        path.write_text(new)
        git(project, "commit", "-qam", f"upstream: {name}")

    git(project, "checkout", "-q", "main")
    merged = git(project, "merge", "--no-edit", "upstream")
    assert "CONFLICT" not in merged.stdout + merged.stderr
    assert not git(project, "status", "--porcelain").stdout.strip()

    # The merged fork, installed plainly and run from a folder that is not the checkout.
    env = installed_plainly(project, tmp_path)
    anywhere = tmp_path / "anywhere"
    anywhere.mkdir()
    ok(train(anywhere, env, "experiment=blobs_wide"))
    (run,) = run_dirs(anywhere / "logs")
    outcome = summary(run)
    assert outcome["status"] == "completed" and outcome["groups"]["model"] == "wide"
    assert outcome["groups"]["trainer"] == "fork"
    assert outcome["metrics"]["test/acc"] > 0.6  # the blobs are easy: the fork's task really trained
    assert "engine fix from upstream is here" in (run / "train.log").read_text()
    config = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert config.seed == 7  # the fork's default
    assert config.trainer.log_every_n_steps == 3  # the fork's own trainer option
    assert config.trainer.gradient_clip_val == 7.5  # upstream's changed engine option, under the fork's
    assert config.model._target_ == "myproject.vision.module.ImageClassifier"  # the renamed package ran


@pytest.mark.parametrize("bad_name", ["", "My-Project", "torch", "lightning", "os", "litlab", "project"])
def test_rename_refuses_a_bad_name_and_changes_nothing(bad_name: str, tmp_path: Path):
    project = copy_of_the_project(tmp_path / "fork")
    before = file_contents(project)
    result = make_rename(project, bad_name)
    assert result.returncode != 0
    (message,) = [line for line in result.stderr.splitlines() if line.startswith("rename: error:")]
    assert f"NAME={bad_name}" in message or "make rename NAME=" in message
    assert file_contents(project) == before
