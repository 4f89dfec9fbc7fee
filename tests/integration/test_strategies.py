"""Samples of tests/unit/test_strategies.py's walk that need real processes: a refused combination
really ends ``litlab-train`` in one line (before any run directory exists). An accepted multi-process
one with a 16-bit precision really trains on 2 CPU ranks in tests/integration/test_notebook.py, which
compares that ddp run with the same run forked from a notebook (strategy=ddp_notebook)."""

from __future__ import annotations

import pytest

from tests.conftest import TINY, litlab, run_dirs

pytestmark = pytest.mark.slow


def test_fsdp_on_a_cpu_ends_in_one_line_naming_it_and_what_to_use(log_dir):
    result = litlab("litlab-train", "strategy=fsdp", "trainer.devices=2", *TINY, timeout=60)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("litlab: error: strategy=fsdp needs GPUs (trainer.accelerator=gpu)"), line
    assert "use strategy=ddp" in line and "Traceback" not in result.stderr
    assert not run_dirs(log_dir)
