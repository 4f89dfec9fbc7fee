"""A non-finite loss stops the run (or is skipped), and gradient clipping tames what would explode.

All three runs use the same absurd learning rate: plain SGD at 1e9 turns the loss to inf/nan within
a few steps. Checkpoints are written after every optimizer step, so "the last good checkpoint" is
the one just before the bad step.
"""

from __future__ import annotations

import re

from tests.conftest import TINY, litlab, ok, run_dirs, summary

EXPLODING = [
    *[t for t in TINY if not t.startswith(("trainer.max_epochs", "trainer.limit_train_batches"))],
    "trainer.max_epochs=3",
    "trainer.limit_train_batches=3",
    "optimizer=sgd",
    "optimizer.lr=1e9",
    "optimizer.weight_decay=0",
    # A checkpoint after every optimizer step (no metric to wait for).
    "callbacks.checkpoint.monitor=null",
    "callbacks.checkpoint.every_n_epochs=null",
    "callbacks.checkpoint.every_n_train_steps=1",
]


def load(path: str) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def all_finite(checkpoint: dict) -> bool:
    import torch

    tensors = [t for t in checkpoint["state_dict"].values() if t.is_floating_point()]
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors)


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(log_dir):
    result = litlab("litlab-train", *EXPLODING)

    assert result.returncode == 1, result.stderr[-3000:]
    last_line = result.stderr.strip().splitlines()[-1]
    found = re.match(
        r"litlab: error: at global step (\d+) \(.*?\) the (loss|gradient norm) is (nan|inf)", last_line
    )
    assert found, last_line
    step = int(found.group(1))
    assert step >= 1  # the first batch's loss is finite: the explosion needs an update or two
    assert "on_nonfinite=skip" in last_line and "Traceback" not in result.stderr
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "failed" and f"global step {step}" in outcome["error"]
    assert outcome["nonfinite"]["failed_at_step"] == step == outcome["global_step"]
    # The bad step never reached the weights, and nothing was saved after it.
    last = load(outcome["checkpoints"]["last"])
    assert last["global_step"] == step
    assert all_finite(last)


def test_on_nonfinite_skip_drops_those_steps_and_counts_them(log_dir):
    result = ok(litlab("litlab-train", *EXPLODING, "on_nonfinite=skip"))
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "completed"
    report = outcome["nonfinite"]
    assert report["action"] == "skip" and report["skipped_steps"] >= 1
    assert len(report["skipped_at_steps"]) == report["skipped_steps"]
    assert outcome["global_step"] == 3 * 3  # skipped steps still count as steps
    assert all_finite(load(outcome["checkpoints"]["last"]))  # no skipped step touched the weights
    skips = [line for line in result.stdout.splitlines() if "optimizer step skipped" in line]
    assert len(skips) == report["skipped_steps"]


def test_gradient_clipping_keeps_the_exploding_run_finite(log_dir):
    # Clipping the gradient norm to 1e-9 bounds each SGD update at 1e9 x 1e-9 = 1.
    ok(
        litlab(
            "litlab-train",
            *EXPLODING,
            "trainer.gradient_clip_val=1e-9",
            "trainer.gradient_clip_algorithm=norm",
        )
    )
    (run,) = run_dirs(log_dir)
    outcome = summary(run)
    assert outcome["status"] == "completed" and outcome["nonfinite"]["skipped_steps"] == 0
    assert outcome["global_step"] == 9
    assert outcome["metrics"]["val/loss"] < 10  # finite and sane, where unclipped it is nan
    assert outcome["metrics"]["val/acc"] > 0.2  # and it learned (chance is 0.1)
