"""A bad config fails before Hydra starts: exit 2, one sentence naming the key, no run directory."""

from __future__ import annotations

import pytest

from tests.conftest import litlab, run_dirs

CASES = {
    "unknown key": (["trainer.max_epoch=3"], ["trainer.max_epoch"]),
    "wrong type": (["trainer.max_epochs=abc"], ["trainer.max_epochs", "abc"]),
    "unknown group option": (["precision=fp61"], ["fp61", "precision", "bf16", "fp32"]),
    "global batch does not divide": (
        ["data.global_batch_size=100", "trainer.accumulate_grad_batches=3"],
        ["data.global_batch_size=100", "3"],
    ),
    "zero epochs": (["trainer.max_epochs=0"], ["trainer.max_epochs=0"]),
    "zero batch size": (["data.batch_size=0"], ["data.batch_size=0"]),
    "zero accumulation": (
        ["trainer.accumulate_grad_batches=0"],
        ["trainer.accumulate_grad_batches=0"],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_config_fails_before_any_run_directory(case: str, log_dir):
    overrides, words = CASES[case]
    result = litlab("litlab-train", *overrides)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not log_dir.exists() or not run_dirs(log_dir)


def test_bad_config_does_not_import_torch(log_dir):
    # -X importtime lists every module imported; validation must stay torch-free to fail fast.
    import subprocess
    import sys

    code = "import sys; sys.argv=['litlab-train','precision=fp61']; from litlab.train import main; main()"
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "hydra" in imported
    assert "torch" not in imported and "lightning" not in imported


def test_eval_without_checkpoint_path_says_what_to_pass(log_dir):
    result = litlab("litlab-eval")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "litlab: error: ckpt_path is required: litlab-eval ckpt_path=<run dir>/checkpoints/last.ckpt"
    ]
