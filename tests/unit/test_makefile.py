"""The Makefile's own help: ``make help`` lists every target a user can run."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target():
    makefile = (REPO / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY: (.+)$", makefile, re.M)
    # help needs no .venv, so this runs make itself, not a copy of its grep.
    result = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[1] for line in result.stdout.splitlines() if line.strip().startswith("make ")}
    assert set(phony.split()) <= listed, f"make help does not list {set(phony.split()) - listed}"
    for target in ("test-fast", "lint", "bench", "clean"):  # the ones README.md names
        assert target in listed
