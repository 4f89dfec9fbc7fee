"""``litlab-eval ckpt_path=PATH``: test a checkpoint on the test split it was trained against.

The module, data and precision are rebuilt from the run config stored in the checkpoint, which is
loaded with torch's safe ``weights_only=True``. Writes ``eval.json`` in its own run directory.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from litlab import garbage_collection, preflight, schema

schema.register()


@hydra.main(version_base="1.3", config_path=str(preflight.CONFIG_DIR), config_name="eval")
def evaluate(cfg: DictConfig) -> float | None:
    # Imported here, not at the top: a bad config must fail before torch and Lightning load.
    import json
    import logging
    from pathlib import Path

    import lightning as L
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from litlab.build import build_datamodule, build_module
    from litlab.callbacks.progress import progress_bar
    from litlab.errors import check_gpus_available, load_weights, one_line_errors, read_run_checkpoint

    log = logging.getLogger("litlab")
    with one_line_errors():  # not a checkpoint, another model's, no such GPU: one line, no traceback
        checkpoint = read_run_checkpoint(cfg.ckpt_path)
        train_cfg = OmegaConf.create(checkpoint["hyper_parameters"]["config"])
        data = build_datamodule(train_cfg.data, train_cfg.data.batch_size)
        module = build_module(train_cfg, total_steps=checkpoint["hyper_parameters"]["total_steps"])
        load_weights(module, checkpoint, cfg.ckpt_path)
        check_gpus_available(cfg, prefix="")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        precision=train_cfg.precision.value,
        logger=False,
        callbacks=[progress_bar()],
        default_root_dir=str(run_dir),
    )
    trainer.test(module, datamodule=data, ckpt_path=cfg.ckpt_path, weights_only=True, verbose=False)
    metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())}
    result = {
        "ckpt_path": str(cfg.ckpt_path),
        "run_name": train_cfg.get("run_name"),
        "metrics": metrics,
    }
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, value in metrics.items():
        log.info("%s = %.6f", name, value)
    return metrics.get("test/acc")


def main() -> None:
    """Console script: check the command line's config, then hand over to Hydra."""
    preflight.check_or_exit("eval", sys.argv[1:])
    try:
        evaluate()
    finally:
        garbage_collection.skip_collection_at_exit()


if __name__ == "__main__":
    main()
