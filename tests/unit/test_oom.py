"""What the out-of-memory message advises, for each kind of run."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import TINY, logged, train_in_process


def test_advice_names_only_what_would_help():
    from litlab.config.rules import BatchSizes
    from litlab.run.oom import advice

    def words(
        micro: int | None, precision: str = "32-true", global_batch: int | None = None, action: str = "fail"
    ):
        cfg = OmegaConf.create(
            {
                "global_batch_size": global_batch,
                "precision": {"value": precision},
                "oom": {"action": action},
            }
        )
        sizes = BatchSizes(micro=micro, accumulation=2, world_size=1, effective=micro and micro * 2)
        error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return advice(cfg, type("Run", (), {"batch_sizes": sizes})(), 3, error, "")

    full = words(64)
    assert "data.batch_size=32 trainer.accumulate_grad_batches=4" in full and "precision=bf16" in full
    assert "precision=" not in words(64, precision="bf16-mixed")  # already 16-bit
    assert "data.batch_size" not in words(1) and "oom=auto_shrink" not in words(1)  # cannot shrink
    assert "global_batch_size stays 128" in words(64, global_batch=128)
    assert "oom=auto_shrink" not in words(64, action="auto_shrink")
    assert "a GPU with more memory" in words(1, precision="bf16-mixed")
    # A datamodule without batch_size (it sizes its own batches): nothing to halve, no micro-batch named.
    assert words(None).startswith("out of memory at global step 3 (CUDA") and "data.batch_size" not in words(
        None
    )


# Memory runs out on purpose, on CPU: tests.faults.MLPOutOfMemoryAbove32 raises CUDA's out-of-memory
# error for batches of more than 32 samples.
OUT_OF_MEMORY_ABOVE_32 = ["model=mlp", "model.net._target_=tests.faults.MLPOutOfMemoryAbove32"]


def test_auto_shrink_halves_the_micro_batch_until_it_fits_and_keeps_the_effective_batch(tmp_path):
    outcome = train_in_process(
        tmp_path, *OUT_OF_MEMORY_ABOVE_32, "oom=auto_shrink", "data.batch_size=128", *TINY
    )
    assert outcome["status"] == "completed"
    assert (outcome["micro_batch_size"], outcome["accumulate_grad_batches"]) == (32, 4)
    assert outcome["effective_batch_size"] == 128
    assert outcome["oom"]["tried_micro_batch_sizes"] == [128, 64, 32] and outcome["oom"]["shrinks"] == 2
    # limit_train_batches=4 at 128 is 4 optimizer steps; doubled twice with the halvings, it still is.
    assert outcome["global_step"] == 4
    assert logged(tmp_path / "run", "micro-batch 32 x accumulation 4 fits (effective batch 128)")
    (config,) = (tmp_path / "logs" / "train" / "runs").glob("*/config.yaml")  # the stored config: what ran
    assert OmegaConf.load(config).data.batch_size == 32


def test_batch_size_finder_picks_the_largest_batch_that_fits_and_trains_with_it(tmp_path):
    outcome = train_in_process(
        tmp_path,
        *OUT_OF_MEMORY_ABOVE_32,
        "tune.batch_size=true",
        "tune.init_val=4",
        "tune.steps_per_trial=1",
        *TINY,
    )
    assert outcome["status"] == "completed"
    assert outcome["tune"] == {"batch_size": 32, "initial_batch_size": 64, "mode": "power"}
    assert outcome["micro_batch_size"] == 32 and outcome["effective_batch_size"] == 32
    assert logged(tmp_path / "run", "picked data.batch_size=32")
    assert not list(
        (tmp_path / "run").glob(".scale_batch_size_*")
    )  # the finder's temporary checkpoint is gone
