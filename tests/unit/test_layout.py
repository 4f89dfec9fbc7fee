"""The two rooms: the engine names no task and imports nothing of your package."""

from __future__ import annotations

import re

from tests.conftest import REPO

ENGINE = REPO / "src" / "litlab"


def engine_files() -> list:
    return sorted(ENGINE.rglob("*.py"))


def test_the_engine_names_no_task():
    # What the issue's `grep -rniE 'classif|digits|image_shape|num_classes' src/litlab` looks for.
    words = re.compile(r"classif|digits|image_shape|num_classes", re.I)
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in engine_files()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if words.search(line)
    ]
    assert not found, found


def test_the_engine_never_imports_your_package():
    imports = re.compile(r"^\s*(from|import)\s+project\b", re.M)
    assert not [p for p in engine_files() if imports.search(p.read_text())]
