"""``litlab-train``: compose the config, build the Trainer, fit, test, write summary.json.

litlab-train model=mlp precision=bf16 trainer.max_epochs=3 trainer.accumulate_grad_batches=4
litlab-train -m precision=fp32,bf16 trainer.accumulate_grad_batches=1,4
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litlab.cli.api import start, train_run
from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR
from litlab.launch import multirun
from litlab.run.summary import sweep_job

schema.register()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def train(cfg: DictConfig) -> float | None:
    """One run: a sweep's job (a failure is its report row), or a single run."""
    if sweep_job() is not None:
        return multirun.run_sweep_job(cfg, train_run)
    return train_run(cfg)


def main() -> None:
    """Console script."""
    start("train", train)


if __name__ == "__main__":
    main()
