"""The torch-free checks of a composed train config (``check_train_config``) and where the configs
are read from (``CONFIG_DIR``, ``config_dirs``). The command line's preflight, which runs them
before Hydra starts, is ``litlab.cli.preflight``; each sweep job runs them when it starts.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from litlab.config import rules, signatures

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"


def check_train_config(cfg: DictConfig, overrides: list[str]) -> None:
    """The torch-free checks of a train config: every ``_target_`` node's keys and plain types
    (trainer's against lightning.Trainer), then the engine's rules, which read well-typed values."""
    signatures.check(cfg, overrides, config_dirs(cfg))
    rules.check(cfg)


def config_dirs(cfg: DictConfig) -> list[Path]:
    """Where config groups are read from: configs/ and the ``file://`` entries of hydra.searchpath."""
    extra = [
        Path(str(entry).removeprefix("file://"))
        for entry in OmegaConf.select(cfg, "hydra.searchpath", default=None) or []
        if str(entry).startswith("file://")
    ]
    return [CONFIG_DIR, *extra]
