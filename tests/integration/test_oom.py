"""Out of memory without auto_shrink: the command's last line says what would help (auto_shrink and
the batch-size finder, in this process: tests/unit/test_oom.py).

Memory runs out on purpose, on CPU: ``tests.faults.MLPOutOfMemoryAbove32`` raises CUDA's
out-of-memory error for batches of more than 32 samples.
"""

from __future__ import annotations

from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, run_dirs, summary

OUT_OF_MEMORY_ABOVE_32 = ["model=mlp", "model.net._target_=tests.faults.MLPOutOfMemoryAbove32"]


def test_out_of_memory_without_auto_shrink_says_what_would_help(log_dir):
    result = litlab(
        "litlab-train", *OUT_OF_MEMORY_ABOVE_32, "data.batch_size=128", *TINY, env=FAULTS_IMPORTABLE
    )
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("litlab: error: out of memory at global step 0 with micro-batch 128")
    for advice in (
        "data.batch_size=64",
        "trainer.accumulate_grad_batches=2",
        "precision=bf16",
        "oom=auto_shrink",
    ):
        assert advice in last_line
    assert "Traceback" not in result.stderr
    (run,) = run_dirs(log_dir)
    assert summary(run)["status"] == "failed" and summary(run)["error"] in last_line
