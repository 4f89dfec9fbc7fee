"""``litlab-eval ckpt_path=PATH``: test a checkpoint on the test split of the data it was trained on,
rebuilt from the run config the checkpoint carries (``RunConfigInCheckpoint``; ``litlab-predict``
rebuilds it the same way), weights loaded with ``weights_only=True``; writes ``eval.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from litlab.cli import quiet
from litlab.cli.api import start
from litlab.config import schema
from litlab.config.preflight import CONFIG_DIR

schema.register()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval")
def evaluate(cfg: DictConfig) -> float | None:
    with rebuilt_checkpoint(cfg) as (run_dir, stored, train_cfg, data, module):
        trainer = checkpoint_trainer(cfg, train_cfg, run_dir)
        with weights_that_fit(cfg.ckpt_path, stored):
            trainer.test(module, datamodule=data, ckpt_path=cfg.ckpt_path, weights_only=True, verbose=False)
    metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())}
    result = {"ckpt_path": str(cfg.ckpt_path), "run_name": train_cfg.get("run_name"), "metrics": metrics}
    (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    optimized = str(train_cfg.get("optimized_metric") or "")
    tested = "test/" + optimized.split("/", 1)[-1]
    shown = sorted(metrics, key=lambda name: (name != tested, name))  # the optimized metric's twin first
    values = ", ".join(f"{name} = {metrics[name]:.4g}" for name in shown) or "no test metrics logged"
    logging.getLogger("litlab").info("%s; eval: %s", values, run_dir / "eval.json")
    return metrics.get(tested)


@contextlib.contextmanager
def rebuilt_checkpoint(cfg: DictConfig) -> Iterator[tuple[Path, dict, DictConfig, Any, Any]]:
    """(run directory, stored run record, run config, datamodule, module without weights) of
    ``cfg.ckpt_path``, with ``cfg.data`` where given. Bad input in the block (not a checkpoint, another
    model's, no such GPU) ends the command with one line, no traceback, no run directory left."""
    # Imported here, not at the top: a bad config must fail before torch and Lightning load.
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from litlab.config.redact import unresolvable
    from litlab.errors import LitlabError, check_gpus_available
    from litlab.logs import route_lightning_logs_to_root
    from litlab.run.build import build_datamodule, build_module
    from litlab.run.ending import one_line_errors
    from litlab.storage.checkpoints import RUN_CONFIG_KEY, read_run_checkpoint

    route_lightning_logs_to_root()
    quiet.drop_known_noise()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with _no_run_dir_after_bad_input(run_dir), one_line_errors():
        stored = read_run_checkpoint(cfg.ckpt_path)[RUN_CONFIG_KEY]
        train_cfg = OmegaConf.create(stored["config"])
        if cfg.get("data") is not None:  # data=NAME: other data than the run's, resolved in this config
            train_cfg.data = OmegaConf.to_container(cfg.data, resolve=True)
        # A checkpoint stores values from the environment as their interpolations (litlab.config.redact):
        # they resolve here, from this process's environment; one line names any that cannot.
        problem = unresolvable(train_cfg, ("data", "model", "precision"))
        if problem is not None:
            raise LitlabError(f"ckpt_path={cfg.ckpt_path}: {problem}")
        data = build_datamodule(train_cfg, train_cfg.data.get("batch_size"))
        module = build_module(OmegaConf.merge(train_cfg, {"compile": False}))
        check_gpus_available(cfg, prefix="")
        yield run_dir, stored, train_cfg, data, module


def checkpoint_trainer(cfg: DictConfig, train_cfg: DictConfig, run_dir: Path, *callbacks: Any) -> Any:
    """The Trainer that tests or predicts: where ``cfg`` says, at the run's precision, with no logger."""
    import lightning as L

    from litlab.callbacks.progress import progress_bar

    return L.Trainer(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        strategy=cfg.get("strategy", "auto"),  # litlab-predict's settings
        num_nodes=cfg.get("num_nodes", 1),
        precision=train_cfg.precision.value,
        logger=False,
        callbacks=[progress_bar(), *callbacks],
        default_root_dir=str(run_dir),
    )


@contextlib.contextmanager
def weights_that_fit(ckpt_path: str, stored: dict, other_data: str | None = None) -> Iterator[None]:
    """Lightning's error for weights that do not fit the rebuilt module, as one line naming the model;
    with ``other_data`` (litlab-predict data=NAME), any error: the data is another task's."""
    from litlab.errors import LitlabError

    model = stored.get("choices", {}).get("model", "?")
    try:
        yield
    except LitlabError:
        raise
    except Exception as error:
        if other_data is not None:
            raise LitlabError(
                f"data={other_data} does not fit model={model} of ckpt_path={ckpt_path}, trained on "
                f"data={stored.get('choices', {}).get('data', '?')} ({type(error).__name__}: "
                f"{_first_line(error)}): predict on data of the task it was trained on"
            ) from error
        if not isinstance(error, RuntimeError) or "state_dict" not in str(error):
            raise
        raise LitlabError(
            f"ckpt_path={ckpt_path} holds weights that do not fit model={model}, the model its "
            f"config names ({_first_line(error)}): they come from another model, or from an older "
            "version of its network code"
        ) from error


@contextlib.contextmanager
def _no_run_dir_after_bad_input(run_dir: Path) -> Iterator[None]:
    """Bad input (exit 2) leaves nothing behind, as in preflight: the run directory Hydra made goes,
    with its parents where that leaves them empty."""
    try:
        yield
    except SystemExit as stop:
        if stop.code == 2:
            # Hydra's log file is in it: closed first, so that this process (a test, a notebook) does
            # not go on logging into a file whose folder is gone.
            root = logging.getLogger()
            for handler in list(root.handlers):
                if isinstance(handler, logging.FileHandler) and run_dir in Path(handler.baseFilename).parents:
                    root.removeHandler(handler)
                    handler.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # <task>/runs/, then <task>/, if that left them empty
                run_dir.parent.rmdir()
                run_dir.parent.parent.rmdir()
        raise


def _first_line(error: BaseException) -> str:
    # Two lines, not errors.first_line's one: a state_dict error names its first mismatch on the second.
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines[:2])[:200] if lines else type(error).__name__


def main() -> None:
    """Console script."""
    start("eval", evaluate)


if __name__ == "__main__":
    main()
