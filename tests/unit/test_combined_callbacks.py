"""litlab's callbacks run as one Lightning callback (litlab.callbacks.combined), and its Trainer
profiles nothing unless asked (NoProfiler): each hook still reaches every part that defines it, in
order, once; the parts' states are checkpointed under their own keys; a real fit sees no difference."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.callbacks.progress import TQDMProgressBar

from litlab.callbacks.combined import HOOKS, CombinedCallbacks, combinable, combine, parts_of
from litlab.callbacks.progress import PlainProgress
from litlab.callbacks.run_stats import RunStats
from litlab.data.tensor_batches import ReseedEveryStep
from litlab.run.build import NoProfiler
from litlab.run.hangs import HeartbeatAfterYourCallbacks


class Recorder(Callback):
    """Records the hooks it defines, with its name: every hook Lightning hands to callbacks."""

    def __init__(self, name: str, seen: list) -> None:
        self.name, self.seen = name, seen


for _hook in HOOKS:
    setattr(Recorder, _hook, lambda self, *a, _hook=_hook, **k: self.seen.append((_hook, self.name)))


class OnlyBatchEnd(Callback):
    def __init__(self, seen: list) -> None:
        self.seen = seen

    def on_train_batch_end(self, *args) -> None:
        self.seen.append(("on_train_batch_end", "only"))


class Counter(Callback):
    def __init__(self) -> None:
        self.count = 0

    def on_train_batch_end(self, *args) -> None:
        self.count += 1

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state_dict: dict) -> None:
        self.count = state_dict["count"]


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=4)


def fit(tmp_path, callbacks, max_steps=6, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=max_steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Tiny(), ckpt_path=ckpt_path)
    return trainer


def test_every_hook_reaches_the_parts_that_define_it_in_their_order_once(tmp_path):
    alone, combined = [], []
    fit(tmp_path / "a", [Recorder("a", alone), OnlyBatchEnd(alone), Recorder("b", alone)])
    fit(
        tmp_path / "b",
        [CombinedCallbacks([Recorder("a", combined), OnlyBatchEnd(combined), Recorder("b", combined)])],
    )
    assert combined == alone
    assert {hook for hook, _ in alone} >= {"setup", "on_train_batch_start", "on_before_backward", "teardown"}
    assert alone.count(("on_train_batch_end", "only")) == 6


def test_the_parts_states_are_checkpointed_under_their_own_keys_and_restored(tmp_path):
    counter = Counter()
    trainer = fit(tmp_path, [CombinedCallbacks([counter, Callback()])], max_steps=4)
    path = tmp_path / "four.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["callbacks"]
    assert saved == {"CombinedCallbacks": {"Counter": {"count": 4}}}
    resumed = Counter()
    fit(tmp_path, [CombinedCallbacks([resumed, Callback()])], max_steps=6, ckpt_path=path)
    assert resumed.count == 4 + 2
    # A checkpoint written before the parts ran combined: the part's state under its own key.
    old = torch.load(path, weights_only=True)
    old["callbacks"] = {"Counter": {"count": 3}}
    torch.save(old, tmp_path / "old.ckpt")
    from_old = Counter()
    fit(tmp_path, [CombinedCallbacks([from_old, Callback()])], max_steps=6, ckpt_path=tmp_path / "old.ckpt")
    assert from_old.count == 3 + 2


def test_litlab_and_lightning_callbacks_are_combined_but_those_lightning_looks_for_and_yours():
    class Yours(Callback):
        pass

    stats, reseed, monitor, plain = (
        RunStats(),
        ReseedEveryStep(0),
        LearningRateMonitor(),
        PlainProgress(),
    )
    checkpoint, bar, yours = ModelCheckpoint(), TQDMProgressBar(), Yours()
    made = combine([stats, checkpoint, reseed, yours, monitor, bar, plain])
    assert [type(c).__name__ for c in made] == [
        "CombinedCallbacks",
        "ModelCheckpoint",
        "Yours",
        "TQDMProgressBar",
    ]
    assert made[0].parts == [stats, reseed, monitor, plain]
    assert parts_of(made) == [stats, reseed, monitor, plain, checkpoint, yours, bar]
    assert not combinable(yours) and not combinable(checkpoint) and not combinable(bar)
    assert combine([stats, yours]) == [stats, yours]  # nothing to gain from one part


def test_the_heartbeat_that_follows_your_callbacks_runs_combined_and_last_when_you_have_none():
    class Yours(Callback):
        pass

    stats, reseed, checkpoint, yours = RunStats(), ReseedEveryStep(0), ModelCheckpoint(), Yours()
    beat = HeartbeatAfterYourCallbacks(watch=None)
    made = combine([stats, checkpoint, reseed, beat])
    assert [type(c).__name__ for c in made] == ["CombinedCallbacks", "ModelCheckpoint"]
    assert made[0].parts == [stats, reseed, beat]  # Lightning runs the checkpoint after all three
    made = combine([stats, reseed, yours, beat, checkpoint])
    assert made[1:] == [yours, beat, checkpoint] and made[0].parts == [stats, reseed]


def test_no_profiler_profiles_nothing():
    # A run that asks for a profiler gets it: test_configs.py, debug=profile.
    profiler = NoProfiler()
    with profiler.profile("a") as inside, profiler.profile("b"):
        assert inside is None
    assert profiler.summary() == ""
