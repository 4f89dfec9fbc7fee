"""``litlab-train``: compose the config, build the Trainer, fit, test, write summary.json.

litlab-train model=mlp precision=bf16 trainer.max_epochs=3 trainer.accumulate_grad_batches=4
litlab-train -m precision=fp32,bf16 trainer.accumulate_grad_batches=1,4
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from litlab import garbage_collection
from litlab.cli import quiet
from litlab.cli.api import run_checked, train_run
from litlab.cli.flags import multirun_flag_first
from litlab.cli.paths import check_pasted_paths
from litlab.cli.preflight import check_or_exit
from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR
from litlab.launch import multirun
from litlab.run.summary import SWEEP_JOB_ENV, sweep_job

schema.register()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def train(cfg: DictConfig) -> float | None:
    """Hydra's main: a sweep's job (its sweeper checked its config) or a run the preflight checked."""
    if sweep_job() is not None:  # a multirun job: a failure is a report row, not the sweep's end
        return multirun.run_sweep_job(cfg, train_run)
    return train_run(cfg)


def main() -> None:
    """Console script: check the command line's config, then hand over to Hydra."""
    quiet.drop_known_noise()  # Lightning's tips and known third-party deprecations, exactly
    sys.argv[1:] = multirun_flag_first(sys.argv[1:])  # -m where the user typed it: Hydra wants it first
    check_pasted_paths(sys.argv[1:])  # resume=PATH that Hydra cannot parse: how to quote it
    args = sys.argv[1:]
    checked = None
    if SWEEP_JOB_ENV not in os.environ:  # a sweep job's process: the sweep checked its config
        checked = check_or_exit("train", args)
    try:
        if checked is not None:  # one run (not a sweep)
            run_checked(checked, one_line_exit=True)  # the checked config, not composed again
        else:
            train()  # Hydra's flags, a sweep, a sweep's job, a torchrun rank: Hydra's own main
    finally:
        garbage_collection.skip_collection_at_exit()


if __name__ == "__main__":
    main()
