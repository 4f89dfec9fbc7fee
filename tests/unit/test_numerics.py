"""A non-finite loss stops the run (or is skipped, and its samples are not counted as trained), and
gradient clipping tames what would explode.

In-process runs (``tests.conftest.train_in_process``, as ``litlab-train`` runs them). Most use the
same absurd learning rate: plain SGD at 1e9 turns the loss to inf/nan within a few steps.
Checkpoints are written after every optimizer step, so "the last good checkpoint" is the one just
before the bad step; its weights must equal those of the same run stopped there on purpose
(``trainer.max_steps``).
"""

from __future__ import annotations

import json
import re

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from litlab.callbacks.nonfinite import NonFiniteLossGuard
from litlab.errors import LitlabError
from project.vision.module import ImageClassifier
from tests.conftest import TINY, logged, train_in_process

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
    "test_after_fit=false",
]


def load(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def all_finite(checkpoint: dict) -> bool:
    tensors = [t for t in checkpoint["state_dict"].values() if t.is_floating_point()]
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors)


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # In-process the one-line error is raised, not printed (litlab-train prints it and exits 1).
    with pytest.raises(LitlabError) as stopped:
        train_in_process(tmp_path, *EXPLODING)

    assert stopped.value.exit_code == 1
    last_line = str(stopped.value)
    found = re.match(
        r"litlab: error: at global step (\d+) \(.*?\) the (loss|gradient norm) is (nan|inf)", last_line
    )
    assert found and "on_nonfinite=skip" in last_line, last_line
    step = int(found.group(1))
    assert step >= 1  # the first batch's loss is finite: the explosion needs an update or two
    outcome = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert outcome["status"] == "failed" and f"global step {step}" in outcome["error"]
    assert outcome["nonfinite"]["failed_at_step"] == step == outcome["global_step"]
    # The bad step never reached the weights, and nothing was saved after it: the last checkpoint
    # holds exactly what the same run has after `step` good steps.
    last = load(outcome["checkpoints"]["last"])
    assert last["global_step"] == step and all_finite(last)
    assert f"the last checkpoint, {outcome['checkpoints']['last']}, is kept" in last_line
    good = train_in_process(tmp_path, *EXPLODING, f"trainer.max_steps={step}", name="stopped before")
    assert good["status"] == "completed" and good["global_step"] == step
    expected = load(good["checkpoints"]["last"])["state_dict"]
    assert expected.keys() == last["state_dict"].keys()
    assert all(torch.equal(expected[k], last["state_dict"][k]) for k in expected)


def test_on_nonfinite_skip_drops_those_steps_and_counts_them(tmp_path):
    outcome = train_in_process(tmp_path, *EXPLODING, "on_nonfinite=skip")
    assert outcome["status"] == "completed"
    report = outcome["nonfinite"]
    assert report["action"] == "skip" and report["skipped_steps"] >= 1
    assert len(report["skipped_at_steps"]) == report["skipped_steps"]
    assert outcome["global_step"] == 3 * 3  # skipped steps still count as steps
    assert all_finite(load(outcome["checkpoints"]["last"]))  # no skipped step touched the weights
    skips = logged(tmp_path / "run", "optimizer step skipped")
    assert [int(re.search(r"global step (\d+)", s).group(1)) for s in skips] == report["skipped_at_steps"]


def test_gradient_clipping_keeps_the_exploding_run_finite(tmp_path):
    # Clipping the gradient norm to 1e-9 bounds each SGD update at 1e9 x 1e-9 = 1.
    clipped = ["trainer.gradient_clip_val=1e-9", "trainer.gradient_clip_algorithm=norm"]
    outcome = train_in_process(tmp_path, *EXPLODING, *clipped)
    assert outcome["status"] == "completed" and outcome["nonfinite"]["skipped_steps"] == 0
    assert outcome["global_step"] == 9
    assert outcome["metrics"]["val/loss"] < 10  # finite and sane, where unclipped it is nan
    assert outcome["metrics"]["val/acc"] > 0.2  # and it learned (chance is 0.1)


class BatchNormNet(L.LightningModule):
    """Batch norm then a linear layer; the loss of global step ``bad_step`` is nan (after the forward
    pass that updated the running statistics, as a real overflow would come)."""

    def __init__(self, bad_step: int) -> None:
        super().__init__()
        self.norm, self.layer, self.bad_step = torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1), bad_step

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = self.layer(self.norm(x)).pow(2).mean()
        return loss * float("nan") if self.global_step == self.bad_step else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(32, 4) * 3 + 1)
        return torch.utils.data.DataLoader(data, batch_size=8)


class Buffers(Callback):
    """The batch-norm statistics at each step's start (before the guard's copy) and end, by step."""

    def __init__(self) -> None:
        self.start: dict[int, dict] = {}
        self.end: dict[int, dict] = {}

    @staticmethod
    def _copy(module) -> dict:
        return {name: b.clone() for name, b in module.norm.named_buffers() if b.is_floating_point()}

    def on_train_batch_start(self, trainer, module, *args) -> None:
        self.start[trainer.global_step] = self._copy(module)

    def on_train_batch_end(self, trainer, module, *args) -> None:
        self.end[trainer.global_step - 1] = self._copy(module)


def test_a_skipped_steps_batch_norm_statistics_are_put_back(tmp_path):
    guard, buffers = NonFiniteLossGuard("skip"), Buffers()
    trainer = L.Trainer(
        max_steps=4, callbacks=[guard, buffers], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(BatchNormNet(bad_step=2))
    assert guard.report["skipped_at_steps"] == [2]
    # global_step still advances on a skipped step; steps 0, 1, 3 moved the statistics, step 2 did not.
    for step in range(4):
        moved = any(
            not torch.equal(buffers.start[step][k], buffers.end[step][k]) for k in buffers.start[step]
        )
        assert moved == (step != 2), step


class ClassifierWithANanLossAt(ImageClassifier):
    """The image classifier whose training loss is nan at the global steps ``nan_at_steps``."""

    def __init__(self, *args, nan_at_steps: list[int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_at_steps = set(nan_at_steps)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step in self.nan_at_steps else loss


# 3 epochs of 4 optimizer steps; the first 5 steps are RunStats' warm-up, not timed, whatever the
# accumulation: only the samples of the timed steps that were trained are in the figure.
@pytest.mark.parametrize(("accumulate", "nan_at_steps"), [(1, [2, 6, 9]), (2, [1, 6, 9])])
def test_throughput_counts_only_the_samples_of_steps_that_were_trained(tmp_path, accumulate, nan_at_steps):
    outcome = train_in_process(
        tmp_path,
        *[t for t in TINY if not t.startswith(("trainer.max_epochs", "trainer.limit_train_batches"))],
        "trainer.max_epochs=3",
        f"trainer.limit_train_batches={4 * accumulate}",
        f"trainer.accumulate_grad_batches={accumulate}",
        "model=mlp",
        f"model._target_={__name__}.ClassifierWithANanLossAt",
        f"+model.nan_at_steps={nan_at_steps}",
        "on_nonfinite=skip",
        "test_after_fit=false",
    )
    assert outcome["status"] == "completed" and outcome["accumulate_grad_batches"] == accumulate
    skipped = outcome["nonfinite"]["skipped_at_steps"]
    assert skipped == nan_at_steps and outcome["nonfinite"]["skipped_steps"] == len(skipped)
    throughput = outcome["throughput"]
    micro_batches = outcome["global_step"] * accumulate  # every step has `accumulate` micro-batches
    # Micro-batch b belongs to optimizer step b // accumulate.
    timed_steps = [b // accumulate for b in range(throughput["warmup_steps"] * accumulate, micro_batches)]
    samples_per_micro_batch = outcome["micro_batch_size"] * outcome["world_size"]
    trained = sum(samples_per_micro_batch for step in timed_steps if step not in skipped)
    assert throughput["steady_state_samples"] == trained
