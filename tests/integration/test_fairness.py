"""Rows differ only by what was compared: at a fixed global batch, accumulation and device count
change the summation order of each optimizer step's gradient, never which samples it holds, how
they are weighted, the schedule, or what the run counts (docs/sweeps.md, "What a row's difference
can come from")."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_dirs, start_litlab, summary, train_in_process

pytestmark = pytest.mark.slow

# fp32, no dropout, a schedule with warm-up, 2 epochs of a training split of 629 samples: neither the
# global batch of 64 nor 2 ranks divide it (the epoch's last global batch is incomplete, and a
# DistributedSampler would pad it with repeated samples).
FAIR = [
    "model=mlp",
    "model.net.dropout=0",
    "precision=fp32",
    "global_batch_size=64",
    "data.test_fraction=0.5004",  # 1797 - 899 test - 269 validation = 629 training samples
    "scheduler=cosine",
    "scheduler.warmup_steps=5",
    "trainer.max_epochs=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_model_summary=false",
    "test_after_fit=false",
    "logger=none",
]


def final_weights(outcome: dict) -> dict[str, torch.Tensor]:
    return torch.load(outcome["checkpoints"]["last"], map_location="cpu", weights_only=True)["state_dict"]


def test_accumulation_and_ranks_end_with_the_same_weights_at_a_fixed_global_batch(log_dir, tmp_path):
    # The 2-rank run (real gloo processes) trains while the three accumulations train in this process.
    ranks = start_litlab("litlab-train", *FAIR, "trainer.devices=2", "strategy=ddp")
    outcomes = {
        f"accumulation {n}": train_in_process(
            tmp_path / "in-process", *FAIR, f"trainer.accumulate_grad_batches={n}", name=str(n)
        )
        for n in (1, 2, 4)
    }
    output, _ = ranks.communicate(timeout=300)
    assert ranks.returncode == 0, output[-3000:]
    (run,) = run_dirs(log_dir)
    outcomes["2 ranks"] = summary(run)
    assert outcomes["2 ranks"]["world_size"] == 2

    baseline = outcomes.pop("accumulation 1")
    expected = final_weights(baseline)
    for name, outcome in outcomes.items():
        # The same weights, but for the summation order of accumulation and all-reduce.
        for key, tensor in final_weights(outcome).items():
            torch.testing.assert_close(tensor, expected[key], rtol=1e-4, atol=1e-6, msg=f"{name}: {key}")
        assert outcome["history"][-1]["train_loss"] == pytest.approx(baseline["history"][-1]["train_loss"])
        # The same optimizer steps over the same samples (whole global batches only: 9 of 64 an
        # epoch), counted and timed alike.
        assert outcome["global_step"] == baseline["global_step"] == 2 * 9, name
        assert outcome["history"][-1]["samples"] == baseline["history"][-1]["samples"] == 2 * 9 * 64, name
        steady = (
            outcome["throughput"]["steady_state_samples"],
            baseline["throughput"]["steady_state_samples"],
        )
        assert steady[0] == steady[1], name
