"""``litlab-train`` as a Python function, for scripts and notebooks: ``litlab.train(["model=mlp"])``
trains one run in this process, as the command does, and returns its summary (summary.json);
``litlab.compose`` gives the checked config first, to read or change. The command runs the same
function (``litlab.cli.train``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import run_job
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, open_dict, read_write

from litlab import garbage_collection
from litlab.cli import quiet
from litlab.cli.preflight import checked_config, sweep_overrides
from litlab.config.preflight import CONFIG_DIR
from litlab.config.rules import ConfigError, device_count


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """configs/train.yaml with ``overrides`` (``["model=mlp", "trainer.max_epochs=3"]``), with its
    ``hydra`` node, checked as ``litlab-train`` checks it. Raises ConfigError: the command's one line."""
    sweep = sweep_overrides(list(overrides))
    cfg = None if sweep else checked_config("train", list(overrides))
    if sweep or cfg.hydra.mode == RunMode.MULTIRUN:  # a comma list, or a sweep file
        raise ConfigError(
            f"{' '.join(overrides)} is a sweep: litlab.train trains one run; run a sweep with litlab-train -m"
        )
    return cfg


def train(config: Sequence[str] | DictConfig = ()) -> dict[str, Any]:
    """Train one run in this process, as ``litlab-train OVERRIDES`` would: its run directory, train.log,
    checkpoints in storage, resume of an unfinished run of the same command. ``config``: overrides,
    or a config from ``compose``. Returns the run's summary (summary.json: status, metrics, ...).

    Errors are raised, not printed: ConfigError for a bad config, LitlabError for a run that
    stopped. Several devices: ``strategy=ddp_notebook`` forks their ranks from this process (a
    notebook's way); other strategies need ``litlab-train`` (docs/launch.md)."""
    cfg = config if isinstance(config, DictConfig) else compose(config)
    devices, nodes = device_count(cfg.trainer.devices), cfg.trainer.num_nodes
    forked = cfg.strategy.get("start_method") == "fork"  # Lightning forks the ranks from this process
    if nodes > 1 or ((devices or 1) > 1 and not forked):
        raise ConfigError(
            f"trainer.devices={cfg.trainer.devices} trainer.num_nodes={nodes} strategy={cfg.strategy.name}: "
            "litlab.train trains in this process; several devices of this machine need strategy=ddp_notebook "
            "(ranks forked from it), several machines litlab-train (docs/launch.md)"
        )
    return run_checked(cfg, one_line_exit=False)


def run_checked(cfg: DictConfig, one_line_exit: bool) -> dict[str, Any]:
    """Hydra's single run of ``cfg`` (a checked train config with its ``hydra`` node): the run directory,
    .hydra/, logging, then ``train_run``. ``one_line_exit``: a failure ends the process with one line
    on stderr, as a command does; otherwise it is raised."""
    from litlab.config.identity import run_folder
    from litlab.config.redact import move_typed_secrets
    from litlab.library_internals import hydra_job_callbacks

    # As the multirun's Hydra callback does (CommandLineSecrets): a credential typed on the command
    # line reaches the run through the environment, so no file Hydra or litlab writes holds it.
    move_typed_secrets(cfg)
    # The start's one read of its storage (the resume decision's first half), made here and kept, so
    # the resolver that names the run folder from it (hydra.run.dir) reads nothing.
    run_folder(cfg)
    with read_write(cfg.hydra), open_dict(cfg.hydra):  # RUN: where litlab.run.ending exits in one line
        cfg.hydra.mode = RunMode.RUN if one_line_exit else None
    # Hydra's own single run (what its run mode does after composing); run_job reads no config source,
    # but its context wants the loader of an initialized Hydra.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):
        loader = GlobalHydra.instance().hydra.config_loader
        context = HydraContext(config_loader=loader, callbacks=hydra_job_callbacks(cfg))
        with _root_logging_restored(not one_line_exit):  # the caller's logging after the run, not train.log
            job = run_job(
                train_run, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context
            )
    _ = job.return_value  # raises the run's exception, as Hydra's run mode does
    summary = Path(job.hydra_cfg.hydra.runtime.output_dir) / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else {}


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


@contextlib.contextmanager
def _root_logging_restored(restore: bool) -> Iterator[None]:
    """Hydra's job logging replaces the root logger's handlers with the run's (console, train.log);
    in a caller that goes on (a notebook, a test), its own come back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        if restore:
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
