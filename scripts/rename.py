#!/usr/bin/env python3
"""Rename your project's package for a fork: ``make rename NAME=myproject``.

(``python3 scripts/rename.py myproject`` does the same.)

Renames src/project/ (your LightningModules, networks, datamodules; the examples) to src/myproject/
and every reference to it: ``_target_: project.vision...`` in configs, ``from project...`` in
Python files. The engine (src/litlab/, the ``litlab-*`` commands, ``LITLAB_*`` variables) keeps
its name, so the fork goes on merging the engine's fixes (``git merge upstream/main``); docs and
the README are left as they are for the same reason. The files are the ones git tracks (or, outside
a git checkout, every file but run outputs and caches). Standard library only: it runs before any
environment exists. Afterwards ``make setup`` (any make target) reinstalls the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import os
import re
import subprocess
import sys
from pathlib import Path

# The current name of your package. The script rewrites this line too, so you can rename again.
OLD = "project"
ENGINE = "litlab"
ROOT = Path(__file__).resolve().parents[1]
# Where references to your package are rewritten: code and configs outside the engine.
REWRITTEN_SUFFIXES = (".py", ".yaml", ".yml")
# Not walked outside a git checkout: environments, run outputs, caches.
SKIP_DIRS = {".git", ".venv", "venv", "logs", "outputs", "multirun", ".submitit", "__pycache__"}
SKIP_SUFFIXES = (".egg-info", "_cache")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", default="", help="the new name: a lowercase Python identifier")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project to rename (default: this one)")
    args = parser.parse_args(argv)
    new = args.name.removeprefix("NAME=")
    root = args.root.resolve()
    problem = check_name(new, root)
    if problem:
        print(f"rename: error: {problem}", file=sys.stderr)
        return 2
    files = [f for f in project_files(root) if f.suffix in REWRITTEN_SUFFIXES and not _in_engine(root, f)]
    changed = [path for path in files if rewrite(path, new)]
    (root / "src" / OLD).rename(root / "src" / new)
    this_script = root / "scripts" / "rename.py"
    if this_script.is_file():  # so the renamed project can rename again
        text = this_script.read_text(encoding="utf-8")
        this_script.write_text(text.replace(f'OLD = "{OLD}"', f'OLD = "{new}"', 1), encoding="utf-8")
    print(f"renamed your package {OLD} -> {new}: src/{new}/, {len(changed)} files edited")
    print(f"the engine stays src/{ENGINE}/ (git merge upstream/main keeps bringing its fixes)")
    print("next: make setup (reinstalls the packages), then make test")
    return 0


def check_name(new: str, root: Path) -> str | None:
    """Why ``new`` cannot be the package's name, or None if it can."""
    if not new:
        return "give the new name: make rename NAME=myproject"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", new):
        return f"NAME={new} is not allowed: use lowercase letters, digits and _, starting with a letter"
    if new == OLD:
        return f"NAME={new} is already the package's name"
    if new == ENGINE:
        return f"NAME={new} is the engine's name: your package needs a name of its own"
    if keyword.iskeyword(new) or new in sys.stdlib_module_names:
        return f"NAME={new} is taken by Python itself (a keyword or a standard-library module)"
    if not (root / "src" / OLD).is_dir():
        return f"src/{OLD} not found under {root}: nothing to rename"
    if new in names_in_use(root) or importlib.util.find_spec(new) is not None:
        return f"NAME={new} is taken: the project or an installed package already uses that module name"
    return None


def names_in_use(root: Path) -> set[str]:
    """Top-level modules the project imports and the packages it depends on (pyproject.toml), so
    that the new package never shadows one of them (python3 here may not have them installed)."""
    used = set()
    for path in (root / "src").rglob("*.py"):
        used |= set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", path.read_text(), re.M))
    dependencies = re.findall(r'^\s*"([A-Za-z][\w.-]*)', (root / "pyproject.toml").read_text(), re.M)
    used |= {name.lower().replace("-", "_") for name in dependencies}
    return used - {OLD}


def project_files(root: Path) -> list[Path]:
    """The files of the project: what git tracks, or every file outside run outputs and caches."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(SKIP_SUFFIXES)]
            files += [Path(folder) / name for name in names]
        return sorted(files)
    return sorted(root / name for name in listed.decode().split("\0") if name and (root / name).is_file())


def _in_engine(root: Path, path: Path) -> bool:
    return (root / "src" / ENGINE) in path.parents


# References to the package, not the English word: `project.vision`, `from project import`,
# `import project`, `src/project/`.
_REFERENCE = re.compile(
    rf"(?<![\w.])(?:{OLD}(?=\.[A-Za-z_])|(?<=from ){OLD}(?=\s+import)|(?<=import ){OLD}\b)"
    rf"|(?<=src/){OLD}(?=/)"
)


def rewrite(path: Path, new: str) -> bool:
    """Replace references to the package in one text file. True if it changed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    renamed = _REFERENCE.sub(new, text)
    if renamed == text:
        return False
    path.write_text(renamed, encoding="utf-8")
    return True


if __name__ == "__main__":
    sys.exit(main())
