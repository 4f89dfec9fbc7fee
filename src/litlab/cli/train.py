"""``litlab-train``: compose the config, build the Trainer, fit, test, write summary.json.

litlab-train model=mlp precision=bf16 trainer.max_epochs=3 trainer.accumulate_grad_batches=4
litlab-train -m precision=fp32,bf16 trainer.accumulate_grad_batches=1,4
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from litlab import garbage_collection
from litlab.cli import quiet
from litlab.cli.flags import multirun_flag_first
from litlab.cli.paths import check_pasted_paths
from litlab.cli.preflight import check_or_exit
from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR, check_train_config
from litlab.launch import multirun, ranks
from litlab.run.summary import SWEEP_JOB_ENV, sweep_job

schema.register()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def train(cfg: DictConfig) -> float | None:
    if sweep_job() is not None:  # a multirun job: a failure is a report row, not the sweep's end
        return multirun.run_sweep_job(cfg, train_run)
    # Again, in milliseconds: the preflight leaves commands with Hydra's flags and HYDRA_FULL_ERROR=1 alone.
    check_train_config(cfg, list(HydraConfig.get().overrides.task))
    return train_run(cfg)


def train_run(cfg: DictConfig) -> float | None:
    """One run: build, fit, test, summary.json; returns the metric sweepers optimise."""
    # Imported here, not at the top: a bad config must fail before torch and Lightning load.
    from litlab.launch.ranks import adopt_submitit_local_ranks
    from litlab.logs import route_lightning_logs_to_root
    from litlab.run import oom
    from litlab.run.build import build
    from litlab.run.ending import one_line_errors
    from litlab.run.lifecycle import finish, prepare_run

    route_lightning_logs_to_root()  # Lightning's lines into train.log, rank-prefixed
    quiet.drop_known_noise()  # again: a sweep restores the warning filters after every job
    adopt_submitit_local_ranks()  # a submitit local job's tasks become ranks, as under Slurm
    # one_line_errors: a problem the user can fix is one line on stderr, no traceback; prepare_run:
    # seed, identity, storage, resume decision, and the run's lock, held until the block ends.
    with one_line_errors(), prepare_run(cfg) as run:
        if run.completed:  # the same command after the run finished: nothing left to train
            return run.stored_metric(cfg.optimized_metric)
        with garbage_collection.existing_objects_frozen():  # no full-collection pauses while training
            trainer, module, data = oom.fit(cfg, run, build)  # build, fit; tune.batch_size and oom=
        with run.recording_failure(cfg, trainer):
            return finish(cfg, trainer, module, data, run)  # test, summary.json, the sweep's objective


def main() -> None:
    """Console script: check the command line's config, then hand over to Hydra."""
    quiet.drop_known_noise()  # Lightning's tips and known third-party deprecations, exactly
    sys.argv[1:] = multirun_flag_first(sys.argv[1:])  # -m where the user typed it: Hydra wants it first
    check_pasted_paths(sys.argv[1:])  # resume=PATH that Hydra cannot parse: how to quote it
    if SWEEP_JOB_ENV not in os.environ:  # a sweep job's process: the sweep checked its config
        check_or_exit("train", sys.argv[1:])
    sys.argv[1:] = ranks.with_agreed_run_dir("train", sys.argv[1:])  # torchrun: rank 0's run directory
    try:
        train()
    finally:
        garbage_collection.skip_collection_at_exit()


if __name__ == "__main__":
    main()
