"""How a single run starts: ``start``, every command's main, runs the config its preflight checked as
Hydra's job; ``litlab.train(["model=mlp"])`` trains one run in this process, as ``litlab-train`` does,
and returns its summary (summary.json); ``litlab.compose`` gives the checked config first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, run_job
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, open_dict, read_write

from litlab import garbage_collection
from litlab.cli import preflight, quiet
from litlab.config.identity import one_start
from litlab.config.preflight import CONFIG_DIR
from litlab.config.rules import ConfigError, device_count
from litlab.run.summary import SWEEP_JOB_ENV

# Set by a checked single run's process: the ranks Lightning's launcher starts from it check nothing again.
_CHECKED_ENV = "LITLAB_RANKS_CHECKED"


def start(config_name: str, main: Callable[..., Any]) -> None:
    """``litlab-<config_name>``: check the command line's config and run ``main`` (a ``@hydra.main``) on
    it as Hydra's single run; ``main()`` itself for Hydra's own flags and a sweep."""
    quiet.drop_known_noise()  # Lightning's tips and known third-party deprecations, exactly
    sys.argv[1:] = preflight.multirun_flag_first(sys.argv[1:])  # -m where typed: Hydra wants it first
    preflight.check_pasted_paths(sys.argv[1:])  # a path Hydra cannot parse: how to quote it
    try:
        with one_start():  # the preflight and the run compute each thing once
            checked = _config_to_run(config_name, sys.argv[1:])
            if checked is not None:
                os.environ[_CHECKED_ENV] = str(os.getpid())  # before Lightning starts the run's other ranks
                _run_job(checked, main, one_line_exit=True)
                return
        main()
    finally:
        os.environ.pop(_CHECKED_ENV, None)  # a later start in this process checks again
        garbage_collection.skip_collection_at_exit()


def _config_to_run(config_name: str, args: list[str]) -> DictConfig | None:
    """The config of a single run, checked (or exit 2) where this process is the first to see it."""
    sweep_job = config_name == "train" and SWEEP_JOB_ENV in os.environ  # its sweeper checked it
    # A rank Lightning's launcher started from a checked run: its child, with LOCAL_RANK 1 or more (LOCAL_RANK
    # alone is also torchrun's; rank 0's own LOCAL_RANK=0 reaches any command it starts). Not its children's.
    checked_by = os.environ.pop(_CHECKED_ENV, None)
    lightning_rank = checked_by == str(os.getppid()) and os.environ.get("LOCAL_RANK", "0") != "0"
    return preflight.check_or_exit(config_name, args, check=not (sweep_job or lightning_rank))


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """configs/train.yaml with ``overrides`` (``["model=mlp", "trainer.max_epochs=3"]``), with its
    ``hydra`` node, checked as ``litlab-train`` checks it. Raises ConfigError: the command's one line."""
    sweep = preflight.sweep_overrides(list(overrides))
    cfg = None if sweep else preflight.checked_config("train", list(overrides))
    if sweep or cfg.hydra.mode == RunMode.MULTIRUN:  # a comma list, or a sweep file
        raise ConfigError(
            f"{' '.join(overrides)} is a sweep: litlab.train trains one run; run a sweep with litlab-train -m"
        )
    return cfg


def train(config: Sequence[str] | DictConfig = ()) -> dict[str, Any]:
    """Train one run in this process, as ``litlab-train OVERRIDES`` would (``config``: overrides, or a
    config from ``compose``), and return its summary.json. Errors are raised: ConfigError for a bad
    config, LitlabError for a run that stopped. Several devices: ``strategy=ddp_notebook`` forks their
    ranks from this process; other strategies need ``litlab-train`` (docs/launch.md)."""
    with one_start():  # compose's checks and the run compute each thing once
        cfg = config if isinstance(config, DictConfig) else compose(config)
        devices, nodes = device_count(cfg.trainer.devices), cfg.trainer.num_nodes
        forked = cfg.strategy.get("start_method") == "fork"  # Lightning forks the ranks from this process
        if nodes > 1 or ((devices or 1) > 1 and not forked):
            raise ConfigError(
                f"trainer.devices={cfg.trainer.devices} trainer.num_nodes={nodes} "
                f"strategy={cfg.strategy.name}: litlab.train trains in this process; several devices of "
                "this machine need strategy=ddp_notebook (ranks forked from it), several machines "
                "litlab-train (docs/launch.md)"
            )
        job = _run_job(cfg, train_run, one_line_exit=False)
    summary = Path(job.hydra_cfg.hydra.runtime.output_dir) / "summary.json"
    return json.loads(summary.read_text()) if summary.is_file() else {}


def _run_job(cfg: DictConfig, task: Callable[[DictConfig], Any], one_line_exit: bool) -> JobReturn:
    """Hydra's single run of ``task`` on ``cfg`` (a checked config with its ``hydra`` node): the run
    directory, .hydra/, logging. ``one_line_exit``: a failure ends the process with one line on stderr,
    as a command does; otherwise it is raised."""
    from litlab.config.redact import move_typed_secrets
    from litlab.library_internals import hydra_job_callbacks

    move_typed_secrets(cfg)  # a credential typed on the command line reaches the run by the environment
    with read_write(cfg.hydra), open_dict(cfg.hydra):  # RUN: where litlab.run.ending exits in one line
        cfg.hydra.mode = RunMode.RUN if one_line_exit else None
    # Hydra's own single run; run_job reads no config source, but its context wants an initialized Hydra.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        context = HydraContext(GlobalHydra.instance().hydra.config_loader, hydra_job_callbacks(cfg))
        with _root_logging_restored(not one_line_exit):  # the caller's logging after the run, not train.log
            job = run_job(task, cfg, "hydra.run.dir", None, hydra_context=context)
    _ = job.return_value  # raises the task's exception, as Hydra's run mode does
    return job


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
    """The caller's root logging handlers back after Hydra's job logging replaced them (a notebook)."""
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
