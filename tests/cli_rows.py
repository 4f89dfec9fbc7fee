"""Runs many command lines of litlab's console scripts in one Python process, one after another, and
reports for each: its exit status, its stderr, whether torch or Lightning were imported by then, and
the files under a folder after it. For bad-input rows that fail before torch loads: one process
(one set of imports) instead of one per row, and "no torch import" stays exact, since modules never
leave ``sys.modules``. Imports nothing heavy itself (no torch, no pytest).

``python -m tests.cli_rows < request.json > results.json``: the request holds ``"rows"``
(``[{"argv": [command, *args], "cwd": folder}]``) and ``"watch"`` (folders whose files are listed
before the first row and after each).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

# The console scripts, as pyproject.toml's [project.scripts] names them.
ENTRY_POINTS = {
    "litlab-train": "litlab.cli.train",
    "litlab-eval": "litlab.cli.evaluate",
    "litlab-predict": "litlab.cli.predict",
    "litlab-compare": "litlab.cli.compare",
}
HEAVY = ("torch", "lightning")


def tree(root: Path) -> dict[str, str]:
    """Every file, folder and link under root: a file's sha256, "folder", or where a link points."""
    entries = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(folder, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                entries[key] = f"link to {os.readlink(path)}"
            elif path.is_dir():
                entries[key] = "folder"
            else:
                entries[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def run_row(argv: list[str], cwd: str) -> dict:
    """One command line, as its console script runs it; SystemExit is its exit status."""
    command, *args = argv
    stderr, code = io.StringIO(), 0
    os.chdir(cwd)
    sys.argv = [command, *args]
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            importlib.import_module(ENTRY_POINTS[command]).main()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001  (reported: a row must never get here)
            traceback.print_exc()
            code = None
    return {"code": code, "stderr": stderr.getvalue(), "heavy": [m for m in HEAVY if m in sys.modules]}


def main() -> None:
    request = json.load(sys.stdin)
    watched = lambda: {root: tree(Path(root)) for root in request["watch"]}  # noqa: E731
    before, results = watched(), []
    for row in request["rows"]:
        result = run_row(row["argv"], row["cwd"])
        result["files"] = watched()
        results.append(result)
    json.dump({"before": before, "results": results}, sys.__stdout__)


if __name__ == "__main__":
    main()
