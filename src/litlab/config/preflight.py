"""The torch-free checks of a composed train config, run once per run (``litlab.cli.preflight``, or
a sweep's ``litlab.launch.multirun.plan_job``), and where configs are read from: the fork's
``configs/`` (``CONFIG_DIR``), then the engine's groups (``ENGINE_CONFIG_DIR``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from litlab.config import rules, signatures
from litlab.errors import first_line


def _fork_config_dir() -> Path:
    """The fork's ``configs/``, through the link ``src/litlab_configs``: found the same way in a
    checkout, an editable install and a wheel (the first entry of ``sys.path`` that has it wins)."""
    spec = importlib.util.find_spec("litlab_configs")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("litlab_configs not found: install the project (make setup, or pip install .)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


CONFIG_DIR = _fork_config_dir()
ENGINE_CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"


def check_train_config(cfg: DictConfig, overrides: list[str]) -> None:
    """Every ``_target_`` node's keys and plain types, then the engine's rules (which read well-typed
    values), then the optimized metric against what the module's source logs."""
    signatures.check(cfg, overrides, config_dirs(cfg))
    rules.check(cfg)
    signatures.check_metric_is_logged(cfg)


def config_dirs(cfg: DictConfig) -> list[Path]:
    """Where config groups are read from, first match first: configs/, the ``file://`` entries of
    hydra.searchpath, the engine's groups."""
    extra = [
        Path(str(entry).removeprefix("file://"))
        for entry in OmegaConf.select(cfg, "hydra.searchpath", default=None) or []
        if str(entry).startswith("file://")
    ]
    return [CONFIG_DIR, *extra, ENGINE_CONFIG_DIR]


def composition_message(error: BaseException) -> str:
    """One sentence from a Hydra/OmegaConf composition error and its cause: the option that is not
    in its group, the unknown key (and the allowed ones), or the bad value."""
    if isinstance(error, MissingConfigException) and error.options:
        group, _, name = (error.missing_cfg_file or "").rpartition("/")
        return (
            f"'{name}' is not an option of group '{group}': choose one of {', '.join(sorted(error.options))}"
        )
    cause = error.__cause__
    if not isinstance(cause, OmegaConfBaseException):
        return first_line(str(error))
    key = getattr(cause, "full_key", None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key:
        allowed = rules.allowed_keys(getattr(cause, "object_type", None))
        return f"unknown key '{key}'" + (f": {allowed}" if allowed else "")
    return f"bad value for '{key}': {first_line(str(cause))}" if key else first_line(str(cause))
