"""One litlab run, in-process: ``litlab.cli.api.train_run`` on a composed config (single device).

What a run writes (summary.json, checkpoints) is checked here without starting a process; the
tests in tests/integration/ start ``litlab-train`` where the process itself is under test.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINY, logged, train_in_process


def run_in_process(tmp_path: Path, *overrides: str) -> dict:
    return train_in_process(tmp_path, *overrides)


def test_the_summary_names_last_ckpt_when_the_best_checkpoint_is_an_earlier_one(tmp_path):
    # mode=min on an accuracy that rises: the best checkpoint is the first epoch's, last.ckpt the last's.
    summary = run_in_process(
        tmp_path, "model=mlp", "optimized_metric_mode=min", "trainer.max_epochs=3", *TINY[1:]
    )
    checkpoints = summary["checkpoints"]
    assert summary["status"] == "completed" and summary["epochs"] == 3
    assert checkpoints["best"].endswith("epoch_000-step_000004.ckpt"), checkpoints
    assert checkpoints["last"] == f"{checkpoints['dir']}/last.ckpt" and Path(checkpoints["last"]).is_file()
    assert checkpoints["tested"] == checkpoints["best"]


def test_a_train_loader_that_cannot_restore_its_position_is_reported_not_claimed_exact(tmp_path):
    plain = run_in_process(tmp_path / "plain", "data._target_=tests.faults.DigitsOnAPlainDataLoader", *TINY)
    assert plain["status"] == "completed" and plain["resume_exact"] is False
    warnings = logged(tmp_path / "plain" / "run", "resume is not exact", level="WARNING")
    assert len(warnings) == 1 and "DataLoader" in warnings[0], warnings
    engine_loader = run_in_process(tmp_path / "tensors", *TINY)  # TensorBatches
    assert engine_loader["resume_exact"] is True
    assert not logged(tmp_path / "tensors" / "run", "resume is not exact")


def test_compile_true_trains_the_compiled_forward_and_checkpoints_plain_weights(tmp_path):
    # Both example modules compute their metrics in their steps (torchmetrics, self.log): compile=true
    # must compile the module's forward, which holds the network, and leave the steps eager.
    import torch
    from torch._dynamo.utils import counters

    compiled_before = counters["stats"]["unique_graphs"]
    summary = run_in_process(tmp_path, "compile=true", "model=mlp", *TINY)
    assert summary["status"] == "completed" and summary["global_step"] == 4, summary
    assert counters["stats"]["unique_graphs"] > compiled_before  # torch.compile made a graph
    weights = torch.load(summary["checkpoints"]["last"], weights_only=True)["state_dict"]
    assert weights and not any("_orig_mod" in key for key in weights), sorted(weights)


def test_overrides_reach_the_trainer_and_the_summary(tmp_path):
    overrides = ["model=mlp", "precision=bf16", "trainer.max_epochs=3", "trainer.limit_train_batches=8"]
    overrides += ["trainer.accumulate_grad_batches=4", "data.batch_size=32", "logger=csv"]
    result = train_in_process(tmp_path, *overrides, *TINY[2:-1])  # epochs, train batches and logger set above
    run = tmp_path / "run"
    assert result["groups"]["model"] == "mlp"
    assert result["precision"] == {"requested": "bf16-mixed", "effective": "bf16-mixed"}
    assert (result["micro_batch_size"], result["accumulate_grad_batches"]) == (32, 4)
    assert result["effective_batch_size"] == 128
    assert result["epochs"] == 3
    assert result["global_step"] == 3 * 2  # 8 batches per epoch / accumulation 4
    assert result["versions"]["lightning"] and result["versions"]["torch"]
    assert (run / ".hydra" / "overrides.yaml").is_file()
    train_log = (run / "train.log").read_text()
    assert "[rank 0]" in train_log and "effective batch 128" in train_log
    assert (run / "csv" / "metrics.csv").is_file()


def test_global_batch_size_derives_the_micro_batch(tmp_path):
    result = train_in_process(tmp_path, "global_batch_size=96", "trainer.accumulate_grad_batches=3", *TINY)
    assert (result["micro_batch_size"], result["effective_batch_size"]) == (32, 96)
