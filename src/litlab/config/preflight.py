"""The torch-free checks of a composed train config (``check_train_config``) and where the configs
are read from: the fork's ``configs/`` (``CONFIG_DIR``), then the engine's groups
(``ENGINE_CONFIG_DIR``; ``config_dirs``). The command line's preflight, which runs them
before Hydra starts, is ``litlab.cli.preflight``; each sweep job runs them when it starts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from litlab.config import rules, signatures


def _fork_config_dir() -> Path:
    """The fork's ``configs/``. ``src/litlab_configs`` links to it, so it is found the same way in a
    checkout, an editable install and a wheel (where the link's files are installed as
    ``litlab_configs/``); the first entry of ``sys.path`` that has it wins."""
    spec = importlib.util.find_spec("litlab_configs")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("litlab_configs not found: install the project (make setup, or pip install .)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


CONFIG_DIR = _fork_config_dir()
ENGINE_CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


def check_train_config(cfg: DictConfig, overrides: list[str]) -> None:
    """The torch-free checks of a train config: every ``_target_`` node's keys and plain types
    (trainer's against lightning.Trainer), then the engine's rules, which read well-typed values."""
    signatures.check(cfg, overrides, config_dirs(cfg))
    rules.check(cfg)


def config_dirs(cfg: DictConfig) -> list[Path]:
    """Where config groups are read from, first match first: configs/, the ``file://`` entries of
    hydra.searchpath, the engine's groups."""
    extra = [
        Path(str(entry).removeprefix("file://"))
        for entry in OmegaConf.select(cfg, "hydra.searchpath", default=None) or []
        if str(entry).startswith("file://")
    ]
    return [CONFIG_DIR, *extra, ENGINE_CONFIG_DIR]
