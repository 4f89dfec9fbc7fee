"""What the out-of-memory message advises, for each kind of run."""

from __future__ import annotations

from omegaconf import OmegaConf


def test_advice_names_only_what_would_help():
    from litlab.config.rules import BatchSizes
    from litlab.run.oom import advice

    def words(micro: int, precision: str = "32-true", global_batch: int | None = None, action: str = "fail"):
        cfg = OmegaConf.create(
            {
                "global_batch_size": global_batch,
                "precision": {"value": precision},
                "oom": {"action": action},
            }
        )
        sizes = BatchSizes(micro=micro, accumulation=2, world_size=1, effective=micro * 2)
        error = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return advice(cfg, type("Run", (), {"batch_sizes": sizes})(), 3, error, "")

    full = words(64)
    assert "data.batch_size=32 trainer.accumulate_grad_batches=4" in full and "precision=bf16" in full
    assert "precision=" not in words(64, precision="bf16-mixed")  # already 16-bit
    assert "data.batch_size" not in words(1) and "oom=auto_shrink" not in words(1)  # cannot shrink
    assert "global_batch_size stays 128" in words(64, global_batch=128)
    assert "oom=auto_shrink" not in words(64, action="auto_shrink")
    assert "a GPU with more memory" in words(1, precision="bf16-mixed")
