#!/usr/bin/env python3
"""Rename the template for a fork: ``make rename NAME=myproject`` (``python3 scripts/rename.py myproject``).

Renames the package folder (src/litlab -> src/myproject) and every occurrence of the name in the
project's text files: imports, console scripts (litlab-train -> myproject-train), ``_target_``
references in configs, environment variables (LITLAB_LOG_DIR -> MYPROJECT_LOG_DIR), the README
title. The files are the ones git tracks (or, outside a git checkout, every file but run outputs
and caches). Standard library only: it runs before any environment exists. Afterwards
``make setup`` (any make target) reinstalls the package under its new name.
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

# The current name. This line is renamed with everything else, so a renamed project can rename again.
OLD = "litlab"
ROOT = Path(__file__).resolve().parents[1]
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
    files = project_files(root)
    changed = [path for path in files if rewrite(path, new)]
    moved = move_paths(root, files, new)
    print(f"renamed {OLD} -> {new}: {len(changed)} files edited, {len(moved)} paths moved")
    for old_path, new_path in moved:
        print(f"  {old_path.relative_to(root)} -> {new_path.relative_to(root)}")
    print("next: make setup (reinstalls the package as " + new + "), then make test")
    return 0


def check_name(new: str, root: Path) -> str | None:
    """Why ``new`` cannot be the project's name, or None if it can."""
    if not new:
        return "give the new name: make rename NAME=myproject"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", new):
        return f"NAME={new} is not allowed: use lowercase letters, digits and _, starting with a letter"
    if new == OLD:
        return f"NAME={new} is already the project's name"
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
    return used


def project_files(root: Path) -> list[Path]:
    """The files to rewrite: what git tracks, or every file outside run outputs and caches."""
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


def replacements(new: str) -> list[tuple[str, str]]:
    return [(OLD.upper(), new.upper()), (OLD.capitalize(), new.capitalize()), (OLD, new)]


def rewrite(path: Path, new: str) -> bool:
    """Replace the old name in one text file; binary files are left alone. True if it changed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    renamed = text
    for old_text, new_text in replacements(new):
        renamed = renamed.replace(old_text, new_text)
    if renamed == text:
        return False
    path.write_text(renamed, encoding="utf-8")
    return True


def move_paths(root: Path, files: list[Path], new: str) -> list[tuple[Path, Path]]:
    """Rename every file and folder whose name holds the old name, deepest first."""
    paths = {p for f in files for p in [f, *f.parents] if root in p.parents}
    moved = []
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        if OLD in path.name and path.exists():
            target = path.with_name(path.name.replace(OLD, new))
            path.rename(target)
            moved.append((path, target))
    return moved


if __name__ == "__main__":
    sys.exit(main())
