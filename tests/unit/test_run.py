"""One litlab run, in-process: ``litlab.cli.api.train_run`` on a composed config (single device).

What a run writes (summary.json, checkpoints) is checked here without starting a process; the
tests in tests/integration/ start ``litlab-train`` where the process itself is under test.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINY, train_in_process


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


def test_a_train_loader_that_cannot_restore_its_position_is_reported_not_claimed_exact(tmp_path, caplog):
    plain = run_in_process(tmp_path / "plain", "data._target_=tests.faults.DigitsOnAPlainDataLoader", *TINY)
    assert plain["status"] == "completed" and plain["resume_exact"] is False
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "resume is not exact" in r.getMessage()
    ]
    assert len(warnings) == 1 and "DataLoader" in warnings[0], warnings
    caplog.clear()
    engine_loader = run_in_process(tmp_path / "tensors", *TINY)  # TensorBatches
    assert engine_loader["resume_exact"] is True
    assert not [r for r in caplog.records if "resume is not exact" in r.getMessage()]


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
