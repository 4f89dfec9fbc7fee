"""The engine's layers (docs/development.md): the import-linter contracts of pyproject.toml hold.

The same check as ``make lint``'s ``lint-imports``, in-process: a module that imports from a layer
above its own, two siblings marked independent that import each other, or any import circle in
``src/litlab`` fails here, with import-linter's report of the offending imports.
"""

from __future__ import annotations

from pathlib import Path

import importlinter.api  # noqa: F401 - sets up import-linter's adapters, as its command line does
from importlinter.application import use_cases

ROOT = Path(__file__).resolve().parents[2]


def test_the_engine_keeps_its_layers_and_has_no_import_circle(capsys):
    kept = use_cases.lint_imports(
        config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True, is_debug_mode=True
    )
    report = capsys.readouterr().out
    assert kept, report
    assert "0 broken" in report, report
