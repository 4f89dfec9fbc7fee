"""``litlab-predict ckpt_path=PATH``: a checkpoint's predictions, in files a user opens without litlab.

The checkpoint is rebuilt as ``litlab-eval`` rebuilds it; ``trainer.predict`` runs on the datamodule's
``predict_dataloader`` (or its test split), and rank 0 writes every rank's predictions to
``predictions.csv`` and ``predictions.pt`` in the run directory (``PredictionFiles``; docs/contract.md).
"""

from __future__ import annotations

import logging
from typing import Any

import hydra
from omegaconf import DictConfig

from litlab.cli.api import start
from litlab.cli.evaluate import checkpoint_trainer, rebuilt_checkpoint, weights_that_fit
from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR
from litlab.errors import LitlabError, first_line
from litlab.logs import global_rank

schema.register()
log = logging.getLogger("litlab")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="predict")
def predict(cfg: DictConfig) -> None:
    import warnings

    from hydra.core.hydra_config import HydraConfig

    from litlab.callbacks.prediction_files import PredictionFiles

    # PredictionFiles asks loaders that are not DataLoaders for their indices (TensorBatches can say).
    warnings.filterwarnings("ignore", message="Couldn't infer the batch indices fetched from your dataloader")
    with rebuilt_checkpoint(cfg) as (run_dir, stored, train_cfg, data, module):
        split = _use_test_split_without_predict_dataloader(data)
        _forward_without_predict_step(module)
        trainer = checkpoint_trainer(cfg, train_cfg, run_dir, PredictionFiles(run_dir, split))
        # data=NAME of another task: the module fails in setup or predict_step, said in one line.
        other_data = HydraConfig.get().runtime.choices.get("data") if cfg.get("data") is not None else None
        with weights_that_fit(cfg.ckpt_path, stored, other_data):
            trainer.predict(
                module, datamodule=data, ckpt_path=cfg.ckpt_path, weights_only=True, return_predictions=False
            )


def _forward_without_predict_step(module: Any) -> None:
    """Lightning's default ``forward(batch)`` for a module without predict_step, or a LitlabError naming
    what to add where it has no forward or forward refuses a batch that is not one tensor."""
    import lightning as L
    import torch
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if is_overridden("predict_step", module, L.LightningModule):
        return
    name = type(module).__name__
    add = (
        f"add `def predict_step(self, batch, batch_idx)` to {name}, returning the batch's predictions "
        "(a tensor, or a dict of them, one per sample): `x, _ = batch; return self(x)` for (x, y) "
        "batches (docs/your-task.md)"
    )
    if not is_overridden("forward", module, L.LightningModule):
        raise LitlabError(
            f"{name} has neither predict_step nor forward, so litlab-predict has nothing to call: {add}"
        )
    if global_rank() == 0:
        log.info("%s has no predict_step: Lightning's default calls forward on each batch", name)
    default = module.predict_step

    def predict_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return default(batch, *args, **kwargs)
        except Exception as error:
            if isinstance(batch, torch.Tensor):
                raise
            raise LitlabError(
                f"{name} has no predict_step, and Lightning's default passes each whole batch (here a "
                f"{type(batch).__name__} of {len(batch)}) to forward, which raised {type(error).__name__}: "
                f"{first_line(error)}; {add}"
            ) from error

    module.predict_step = predict_step  # the instance's: Lightning calls it as the module's hook


def _use_test_split_without_predict_dataloader(data: Any) -> str:
    """The split ``trainer.predict`` reads: "predict", or "test" (said in one line) for a datamodule
    without ``predict_dataloader``; a LitlabError for one that has neither."""
    import lightning as L
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if is_overridden("predict_dataloader", data, L.LightningDataModule):
        return "predict"
    name = type(data).__name__
    if not is_overridden("test_dataloader", data, L.LightningDataModule):
        raise LitlabError(
            f"{name} has no predict_dataloader and no test_dataloader: litlab-predict has no data to "
            "predict; define predict_dataloader in your datamodule (docs/contract.md), or pick other "
            "data with data=NAME"
        )
    if global_rank() == 0:  # one line, not one per rank
        log.info("%s has no predict_dataloader: predicting its test split (test_dataloader)", name)

    def test_split() -> Any:
        # Lightning set it up for "predict": a datamodule may build its test split for "test" only.
        data.setup("test")
        return data.test_dataloader()

    # Lightning asks the datamodule instance for its predict_dataloader (an attribute, as here, counts).
    data.predict_dataloader = test_split
    return "test"


def main() -> None:
    """Console script."""
    start("predict", predict)


if __name__ == "__main__":
    main()
