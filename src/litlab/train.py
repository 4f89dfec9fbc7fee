"""``litlab-train``: compose the config, build the Trainer, fit, test, write summary.json.

litlab-train model=mlp precision=bf16 trainer.max_epochs=3 trainer.accumulate_grad_batches=4
litlab-train -m precision=fp32,bf16 trainer.accumulate_grad_batches=1,4
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from litlab import preflight, schema

schema.register()


@hydra.main(version_base="1.3", config_path=str(preflight.CONFIG_DIR), config_name="train")
def train(cfg: DictConfig) -> float | None:
    # Imported here, not at the top: a bad config must fail before torch and Lightning load.
    from litlab.build import build
    from litlab.errors import one_line_errors
    from litlab.oom import fit
    from litlab.run import finish, prepare_run

    with one_line_errors():  # a problem the user can fix: one line on stderr, no traceback
        run = prepare_run(cfg)  # seed, identity, storage
        trainer, module, data = fit(cfg, run, build)  # build, fit; tune.batch_size and oom= (litlab.oom)
        with run.recording_failure(cfg, trainer):
            return finish(cfg, trainer, module, data, run)  # test, summary.json, the sweep's objective


def main() -> None:
    """Console script: check the command line's config, then hand over to Hydra."""
    preflight.check_or_exit("train", sys.argv[1:])
    train()


if __name__ == "__main__":
    main()
