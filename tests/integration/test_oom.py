"""Out of memory: auto_shrink finds a micro-batch that fits and keeps the effective batch; without
it the message says what would help; the batch-size finder picks the largest batch that fits.

Memory runs out on purpose, on CPU: ``tests.faults.MLPOutOfMemoryAbove32`` raises CUDA's
out-of-memory error for batches of more than 32 samples.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ok, run_dirs, summary

OUT_OF_MEMORY_ABOVE_32 = ["model=mlp", "model.net._target_=tests.faults.MLPOutOfMemoryAbove32"]


def test_auto_shrink_halves_the_micro_batch_until_it_fits_and_keeps_the_effective_batch(log_dir):
    result = ok(
        litlab(
            "litlab-train",
            *OUT_OF_MEMORY_ABOVE_32,
            "oom=auto_shrink",
            "data.batch_size=128",
            *TINY,
            env=FAULTS_IMPORTABLE,
        )
    )
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "completed"
    assert (outcome["micro_batch_size"], outcome["accumulate_grad_batches"]) == (32, 4)
    assert outcome["effective_batch_size"] == 128
    assert outcome["oom"]["tried_micro_batch_sizes"] == [128, 64, 32] and outcome["oom"]["shrinks"] == 2
    # limit_train_batches=4 at 128 is 4 optimizer steps; doubled twice with the halvings, it still is.
    assert outcome["global_step"] == 4
    assert "micro-batch 32 x accumulation 4 fits (effective batch 128)" in result.stdout
    (config,) = (log_dir / "storage").glob("*/config.yaml")  # the run's stored config says what ran
    assert OmegaConf.load(config).data.batch_size == 32


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


def test_batch_size_finder_picks_the_largest_batch_that_fits_and_trains_with_it(log_dir):
    result = ok(
        litlab(
            "litlab-train",
            *OUT_OF_MEMORY_ABOVE_32,
            "tune.batch_size=true",
            "tune.init_val=4",
            "tune.steps_per_trial=1",
            *TINY,
            env=FAULTS_IMPORTABLE,
        )
    )
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "completed"
    assert outcome["tune"] == {"batch_size": 32, "initial_batch_size": 64, "mode": "power"}
    assert outcome["micro_batch_size"] == 32 and outcome["effective_batch_size"] == 32
    assert "picked data.batch_size=32" in result.stdout
    assert not list(run.glob(".scale_batch_size_*"))  # the finder's temporary checkpoint is gone
