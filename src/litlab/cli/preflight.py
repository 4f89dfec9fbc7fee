"""The command line's preflight, before Hydra starts the run: no run directory until it is right.

``check_or_exit`` composes the config once and turns any problem (composition, schema, signatures, rules:
no torch import; storage, ``resume=PATH``, the run's lock; the datamodule and optimizer built on the side)
into one ``litlab: error:`` line, exit 2, or with ``HYDRA_FULL_ERROR=1`` its traceback. A sweep is only
composed here: its sweeper checks each job (``litlab.launch.multirun.plan_job``).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from litlab.config import rules, schema, signatures
from litlab.config.identity import once, run_identity
from litlab.config.preflight import (
    CONFIG_DIR,
    check_train_config,
    composition_message,
    config_dirs,
)
from litlab.errors import EXIT_REFUSED, error_line, first_line
from litlab.logs import global_rank
from litlab.storage import lock, roots

MULTIRUN_FLAGS = ("-m", "--multirun")
_PATH_KEYS = ("ckpt_path", "resume")


def multirun_flag_first(args: list[str]) -> list[str]:
    """``args`` with ``-m``/``--multirun`` first (once), as people type it where they think of it:
    Hydra reads its flags before the overrides only (``litlab-train experiment=char_lm -m
    precision=fp32,bf16`` fails with ``unrecognized arguments``)."""
    flags = [arg for arg in args if arg in MULTIRUN_FLAGS]
    if not flags:
        return args
    return [flags[0], *(arg for arg in args if arg not in MULTIRUN_FLAGS)]


def check_pasted_paths(args: Sequence[str]) -> None:
    """Exit 2 with one line on how to quote a ``ckpt_path=``/``resume=`` path that Hydra would misread
    (``=``, brackets, quotes, ``~`` or a comma), before Hydra's own, longer error. The paths litlab
    prints paste as they are."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in args)
    for arg in args:
        key, sep, path = arg.partition("=")
        if not sep or key.lstrip("+") not in _PATH_KEYS:
            continue
        try:
            override = OverridesParser.create().parse_override(arg)
        except HydraException:
            problem = "holds characters Hydra reads as override syntax"
        else:
            if multirun or not override.is_sweep_override():
                continue
            problem = "holds a comma, which Hydra reads as a sweep over several values"
        escaped = path.replace("\\", "\\\\").replace('"', '\\"')  # as Hydra reads a quoted value
        example = shlex.quote(f'{key.lstrip("+")}="{escaped}"')  # then quoted for a POSIX shell
        message = f"{key}={path} {problem}: quote the path for Hydra and the shell, e.g. {example}"
        print(error_line(message), file=sys.stderr)
        sys.exit(EXIT_REFUSED)


def check_or_exit(config_name: str, args: list[str], check: bool = True) -> DictConfig | None:
    """The config ``litlab-<config_name> ARGS`` runs, checked (only composed without ``check``), or exit
    2 with one line. None for a sweep (composed here, checked by its sweeper job by job) and where
    Hydra's own flags other than ``-m`` leave the config to Hydra (--cfg, --help, -cn...)."""
    multirun = bool(args) and args[0] in MULTIRUN_FLAGS  # multirun_flag_first put it there
    overrides = args[1:] if multirun else args
    if any(arg.startswith("-") for arg in overrides):
        return None
    try:
        sweep = sweep_overrides(overrides)
        if multirun or sweep:  # the sweep's base config, as Hydra composes it before its sweeper
            composed(config_name, [o for o in overrides if o not in sweep])
            return None
        cfg = checked_config(config_name, overrides) if check else composed(config_name, overrides)
        return cfg if cfg.hydra.mode != RunMode.MULTIRUN else None
    except rules.ConfigError as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise  # the stack, as a developer asked
        print(error_line(error), file=sys.stderr)
        raise SystemExit(EXIT_REFUSED) from None


def checked_config(config_name: str, args: list[str]) -> DictConfig:
    """The config ``litlab-<config_name> ARGS`` runs, composed (with its ``hydra`` node) and checked;
    raises ConfigError with the command's one line. A sweep file's config is only composed."""
    cfg = composed(config_name, args)
    if cfg.hydra.mode == RunMode.MULTIRUN:
        return cfg
    try:
        if config_name == "train":
            check_train_config(cfg, args)
            check_storage_and_resume(cfg)
        else:
            rules.check_eval(cfg, program=f"litlab-{config_name}")
            if cfg.get("data") is not None:  # litlab-predict data=NAME: its keys, as train checks them
                signatures.check(cfg, args, config_dirs(cfg))
    except roots.StorageError as error:
        raise rules.ConfigError(str(error)) from None
    except MissingMandatoryValue as error:  # e.g. a group's default removed with ~trainer
        raise rules.ConfigError(
            f"'{error.full_key}' has no value: set it, or choose an option of its group"
        ) from None
    if config_name == "train":  # the datamodule and the optimizer partial, built as the run will
        from litlab.run.build import check_by_building  # loads torch and Lightning: not before a typo fails

        check_by_building(cfg)  # after check_storage_and_resume gave Hydra's config to ${hydra:...}
    return cfg


def composed(config_name: str, args: list[str]) -> DictConfig:
    """The config of ``args`` composed as Hydra will (with its ``hydra`` node); raises ConfigError
    naming the override or value that does not compose."""
    for override in _parsed(args):
        if not override.key_or_group:
            raise rules.ConfigError(
                f"malformed override '{override.input_line}': the key before '=' is missing"
            )
    schema.register()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=config_name):
            cfg = compose(config_name, overrides=args, return_hydra_config=True)
    except MissingConfigException as error:
        raise rules.ConfigError(composition_message(error)) from None
    except (HydraException, OmegaConfBaseException) as error:
        raise rules.ConfigError(_user_group_key_message(args, error) or composition_message(error)) from None
    except ValueError as error:  # Hydra's defaults list, e.g. for the override `=3`
        raise rules.ConfigError(
            f"malformed override: {first_line(str(error))} (see --help for the syntax)"
        ) from None
    return cfg


def sweep_overrides(args: list[str]) -> list[str]:
    """The overrides in ``args`` that sweep (comma lists, ranges); raises ConfigError for a malformed one."""
    return [o.input_line for o in _parsed(args) if o.is_sweep_override()]


def _parsed(args: list[str]) -> list:
    try:
        return OverridesParser.create().parse_overrides(args)
    except OverrideParseException as error:
        raise rules.ConfigError(
            f"malformed override '{error.override}': {first_line(error.message)} (see --help for the syntax)"
        ) from None


def check_storage_and_resume(cfg: DictConfig) -> None:
    """The storage root is usable and an explicit ``resume=PATH`` exists, before torch loads."""
    HydraConfig.instance().set_config(cfg)  # configs may use ${hydra:runtime.cwd} and the like
    try:
        storage_cfg = OmegaConf.to_container(cfg.storage, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue:
        example = roots.EXAMPLE_ROOTS.get(cfg.storage.name, "/mnt/drive/litlab")
        raise roots.StorageError(
            f"storage={cfg.storage.name} needs storage.root, e.g. storage.root={example}"
        ) from None
    except OmegaConfBaseException:
        return  # e.g. a root built from the run directory: prepare_run checks it once that exists
    once("storage", storage_cfg, lambda: roots.check_storage(storage_cfg))  # prepare_run asks too
    if cfg.resume not in ("auto", "never"):
        roots.check_checkpoint_exists(str(cfg.resume), storage_cfg)
    if global_rank() == 0:  # another process training this run identity: refuse before torch loads
        identity = run_identity(cfg)
        options = roots.storage_options(storage_cfg)
        lock.check_not_locked(roots.RunStorage(storage_cfg["root"], identity, options))


def _user_group_key_message(args: list[str], error: BaseException) -> str | None:
    """``model.net.hiden=3``: Hydra refuses a key its config lacks without naming the ones it has. For
    a node with a ``_target_``, the signature check's line, on the config as far as Hydra composed it."""
    cause = error.__cause__
    key, node = getattr(cause, "full_key", None) or "", getattr(cause, "parent_node", None)
    if node is None or not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or "." not in key:
        return None
    cfg = node._get_root()  # the error's node belongs to the config composed so far
    try:
        OmegaConf.update(cfg, key, None, force_add=True)
        signatures.check(cfg, args, config_dirs(cfg))
    except rules.ConfigError as refused:
        return str(refused) if f"'{key}'" in str(refused) else None
    except Exception:  # too little composed to check: Hydra's message it is
        return None
    return None
