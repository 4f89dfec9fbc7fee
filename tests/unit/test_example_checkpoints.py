"""The example modules rebuild from their checkpoints with Lightning's own ``load_from_checkpoint``.

A run trains in this process as litlab-train runs it; its ``last.ckpt`` is then loaded with the
module's class method while ``litlab`` cannot be imported (the example tasks, freshly imported, and
Lightning are all a reader of the checkpoint needs), and gives the trained model's outputs.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.conftest import TINY, train_in_process

# What KeepTrainedOutputs saw: the trained module's outputs on a fixed input, and that input.
TRAINED: dict[str, torch.Tensor] = {}


def fixed_input(module: torch.nn.Module) -> torch.Tensor:
    """Four images of the module's shape, or two sequences of its block size, the same every time."""
    generator = torch.Generator().manual_seed(0)
    hparams = module.hparams
    if "image_shape" in hparams:
        return torch.randn(4, *hparams.image_shape, generator=generator)
    return torch.randint(0, hparams.vocab_size, (2, hparams.block_size), generator=generator)


class KeepTrainedOutputs(Callback):
    """Records the trained module's outputs (eval mode) when training ends, before anything else
    (trainer.test loads the best checkpoint into the same module) can change its weights."""

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.eval()
        with torch.no_grad():
            TRAINED["input"] = fixed_input(pl_module)
            TRAINED["outputs"] = pl_module(TRAINED["input"])
        pl_module.train()


PACKAGES = ("litlab", "project")


@contextlib.contextmanager
def engine_unimportable() -> Iterator[None]:
    """``import litlab`` fails, and the example tasks are imported afresh (so any import of the engine
    in them would fail too); everything is put back afterwards."""
    kept = {name: module for name, module in sys.modules.items() if name.split(".")[0] in PACKAGES}
    for name in kept:
        del sys.modules[name]
    sys.modules["litlab"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in PACKAGES]:
            del sys.modules[name]
        sys.modules.update(kept)


@pytest.mark.parametrize(
    ("overrides", "module_path", "class_name"),
    [
        (["model=cnn"], "project.vision.module", "ImageClassifier"),  # BatchNorm: its statistics too
        (["experiment=char_lm"], "project.char_lm.module", "CharLM"),
    ],
    ids=["ImageClassifier", "CharLM"],
)
def test_load_from_checkpoint_rebuilds_the_trained_model_without_litlab(
    overrides, module_path, class_name, tmp_path
):
    TRAINED.clear()
    keep = f"+callbacks.keep._target_={__name__}.KeepTrainedOutputs"
    summary = train_in_process(tmp_path, *overrides, *TINY, "test_after_fit=false", keep)
    assert summary["status"] == "completed", summary
    with engine_unimportable():
        with pytest.raises(ImportError):
            importlib.import_module("litlab")
        module_class = getattr(importlib.import_module(module_path), class_name)
        loaded = module_class.load_from_checkpoint(summary["checkpoints"]["last"], map_location="cpu")
    assert type(loaded).__module__ == module_path and loaded.net is not None
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(TRAINED["input"]), TRAINED["outputs"])
