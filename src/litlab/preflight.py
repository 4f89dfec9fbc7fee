"""Check a command line's config before Hydra starts the run: no torch, no run directory.

Hydra creates the run directory before the task function runs, and reports composition errors as
several lines ending in a hint. ``check_or_exit`` composes the same config first and turns any
problem into one sentence on stderr, naming the bad key or value and what is allowed, then exits 2.
Sweeps given with ``-m`` or comma lists are left to Hydra: each job checks itself when it starts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from litlab import schema, storage

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def check_or_exit(config_name: str, args: list[str]) -> None:
    if any(arg.startswith("-") for arg in args) or os.environ.get("HYDRA_FULL_ERROR") == "1":
        return  # Hydra's own flags (-m, --cfg, --help...), or the user asked for Hydra's full errors
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException as error:
        _exit(
            f"malformed override '{error.override}': {_first_line(error.message)} (see --help for the syntax)"
        )
    if any(o.is_sweep_override() for o in overrides):
        return
    for override in overrides:
        if not override.key_or_group:
            _exit(f"malformed override '{override.input_line}': the key before '=' is missing")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=args, return_hydra_config=True)
    except MissingConfigException as error:
        _exit(_missing_option_message(error))
    except (HydraException, OmegaConfBaseException) as error:
        _exit(composition_message(error))
    except ValueError as error:  # Hydra's defaults list, e.g. for the override `=3`
        _exit(f"malformed override: {_first_line(str(error))} (see --help for the syntax)")
    # A sweep file (hydra.mode: MULTIRUN) is checked on its base config: a bad value all its jobs
    # share fails here once; values its sweeper varies are checked by each job.
    try:
        schema.check(cfg) if config_name == "train" else schema.check_eval(cfg)
        if config_name == "train":
            check_storage_and_resume(cfg)
    except (schema.ConfigError, storage.StorageError) as error:
        _exit(str(error))
    except MissingMandatoryValue as error:  # e.g. a group's default removed with ~trainer
        _exit(f"'{error.full_key}' has no value: set it, or choose an option of its group")


def check_storage_and_resume(cfg: DictConfig) -> None:
    """The storage root is usable and an explicit ``resume=PATH`` exists, before torch loads."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import MissingMandatoryValue

    HydraConfig.instance().set_config(cfg)  # storage.root may use ${hydra:runtime.cwd}
    try:
        storage_cfg = OmegaConf.to_container(cfg.storage, resolve=True)
    except MissingMandatoryValue:
        example = {"s3": "s3://bucket/prefix", "gcs": "gs://bucket/prefix"}.get(
            cfg.storage.name, "/mnt/drive/litlab"
        )
        raise storage.StorageError(
            f"storage={cfg.storage.name} needs storage.root, e.g. storage.root={example}"
        ) from None
    except OmegaConfBaseException:
        return  # e.g. a root built from the run directory: prepare_run checks it once that exists
    storage.check_storage(storage_cfg)
    if cfg.resume not in ("auto", "never"):
        storage.check_checkpoint_exists(str(cfg.resume), storage_cfg)


def composition_message(error: BaseException) -> str:
    """One sentence from a Hydra/OmegaConf composition error and its cause."""
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None)
        reason = _first_line(str(cause))
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key:
            return f"unknown key '{key}'{_allowed_keys(cause)}"
        if key:
            return f"bad value for '{key}': {reason}"
        return reason
    return _first_line(str(error))


def _allowed_keys(error: OmegaConfBaseException) -> str:
    schema_type = getattr(error, "object_type", None)
    if schema_type is None or not dataclasses.is_dataclass(schema_type):
        return ""
    names = [f.name for f in dataclasses.fields(schema_type) if not f.name.startswith("_")]
    return f": allowed keys are {', '.join(names)}"


def _missing_option_message(error: MissingConfigException) -> str:
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    if error.options:
        return (
            f"'{name}' is not an option of group '{group}': choose one of {', '.join(sorted(error.options))}"
        )
    return _first_line(str(error))


def _first_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:1])


def _exit(message: str) -> None:
    print(f"litlab: error: {message}", file=sys.stderr)
    sys.exit(2)
