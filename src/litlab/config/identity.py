"""A run's identity (the name its folder, resume point and lock are found by) and the version of the
user's code (``code_version``) that makes a changed model a new run. No torch import: the preflight
checks the run's lock with it, and Hydra names the run's folder from it, before torch loads.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import hashlib
import json
import logging
import re
import site
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf

from litlab.config import signatures
from litlab.config.redact import REDACTED, is_credential_key
from litlab.storage import resume
from litlab.storage.roots import RunStorage, storage_options

log = logging.getLogger(__name__)

# Config keys that say where a run is stored or logged, or how it is launched, not what it trains:
# left out of its settings, so they never make a new run. Everything else that resolves counts.
NOT_SETTINGS = (
    "hydra",
    "paths",
    "storage",
    "logger",
    "resume",
    "run_name",
    "task_name",
    "experiment_name",  # the identity's prefix
    "hang_timeout",
    "preempt_grace",
)
# An interpolation into these roots, or any resolver (${oc.env:...}, ${hydra:...}), is kept as its
# text: a location or the environment, not a setting (and ${hydra:...} is not set yet when Hydra
# resolves the run's folder from this identity).
_KEPT_AS_TEXT = re.compile(r"\$\{(?:[\w.]*:|(?:" + "|".join(NOT_SETTINGS) + r")[.}])")
_ONE_NODE = re.compile(r"\$\{[\w.]+\}")
_T = TypeVar("_T")
# What the start under way computed (``one_start``), by kind and content: None outside a start.
_this_start: dict[tuple[str, str], Any] | None = None


@contextlib.contextmanager
def one_start() -> Iterator[None]:
    """Within the block (a start: its preflight, Hydra naming its folder, ``prepare_run``), each thing
    ``once`` computes is computed once per content. Outside, always: the user's files may change."""
    global _this_start
    outer = _this_start
    _this_start = {} if outer is None else outer
    try:
        yield
    finally:
        _this_start = outer


def once(kind: str, content: Any, compute: Callable[[], _T]) -> _T:
    """``compute()``, or within ``one_start`` what it gave for the same ``kind`` and ``content``."""
    if _this_start is None:
        return compute()
    key = (kind, json.dumps(content, default=str))
    if key not in _this_start:
        _this_start[key] = compute()
    return copy.deepcopy(_this_start[key])  # a caller's change reaches no other caller


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    """What a run trains, resolved, as ``{"trainer.max_epochs": 3, ...}``: every config value but
    ``NOT_SETTINGS``. ``optimizer.lr=0.002`` and ``2e-3`` are one setting."""
    container = OmegaConf.to_container(cfg, resolve=False)
    written = {name: value for name, value in container.items() if name not in NOT_SETTINGS}
    return once("settings", written, lambda: _settings(cfg, written))


def _settings(cfg: DictConfig, written: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {}

    def walk(node: Any, key: str) -> None:
        if is_credential_key(key.rpartition(".")[2]):
            settings[key] = REDACTED  # written in summary.json; a new password is not a new run
        elif isinstance(node, dict) and node:
            for name, value in node.items():
                walk(value, f"{key}.{name}" if key else str(name))
        # An interpolation whose value is a setting: not a location, the environment, nor a whole node.
        elif (
            isinstance(node, str)
            and "${" in node
            and not (_KEPT_AS_TEXT.search(node) or _ONE_NODE.fullmatch(node))
        ):
            try:
                value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
                settings[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            except Exception:  # OmegaConf's errors: a value that resolves only in the run counts as written
                settings[key] = node
        else:
            settings[key] = node

    for name, value in written.items():
        walk(value, str(name))
    return dict(sorted(settings.items()))


def settings_fingerprint(settings: dict[str, Any], spelled: bool = False) -> str:
    """The SHA-1 of the settings as JSON, a float equal to an integer as that integer (``0`` and
    ``0.0`` are one setting); ``spelled``: apart, as litlab hashed them until 2026-12."""
    text = json.dumps(settings, sort_keys=True, default=str)
    if not spelled:
        whole = json.loads(text, parse_float=lambda s: int(f) if (f := float(s)).is_integer() else f)
        text = json.dumps(whole)
    return hashlib.sha1(text.encode()).hexdigest()


def run_identity(cfg: DictConfig, settings: dict[str, Any] | None = None, spelled: bool = False) -> str:
    """``run_name``, or the experiment name plus a hash of the run's settings: two commands that train
    the same are one run. ``spelled``: the identity litlab gave the run until 2026-12."""
    if cfg.run_name:
        return str(cfg.run_name)
    return f"{cfg.experiment_name}-{settings_fingerprint(settings or run_settings(cfg), spelled)[:10]}"


def start_record(cfg: DictConfig, hydra_cfg: DictConfig, settings: dict[str, Any]) -> dict[str, Any]:
    """What a start records in run.json and the resume decision compares: the code's version, the
    settings' fingerprint (also ``spelled``), and the identity of litlab until 2026-12 (``earlier``)."""
    return {
        **code_version(cfg, hydra_cfg),
        "settings": settings_fingerprint(settings),
        "spelled": settings_fingerprint(settings, spelled=True),
        "earlier": run_identity(cfg, settings, spelled=True),
    }


def run_folder(cfg: DictConfig) -> str:
    """The name of the run's folder (``cfg`` holds Hydra's node): its identity, or where
    ``found_in_storage`` finds the run (kept for the start's resume decision). Every rank, restart and
    requeue of one command computes the same name from the command and the storage alone."""

    def named() -> str:
        identity = run_identity(cfg)
        try:
            found = found_in_storage(cfg, cfg.hydra, identity, keep=True)
        except Exception as error:  # fsspec's, botocore's, an uninstalled backend's: each raises its own
            # Storage that cannot be read: the run's start says why in one line (check_storage).
            log.debug("run folder of %s named without its storage (%s)", identity, error)
            return identity
        return found.folder.identity if found is not None else identity

    return once("folder", _start_content(cfg, cfg.hydra), named)


def _start_content(cfg: DictConfig, hydra_cfg: DictConfig) -> list[Any]:
    """What a start's identity, code version and folder follow from: the config and Hydra's choices."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    sources = [(s.path, s.schema) for s in hydra_cfg.runtime.config_sources]
    choices = OmegaConf.to_container(hydra_cfg.runtime.choices)
    return [container, choices, sources, str(hydra_cfg.job.config_name)]


def found_in_storage(
    cfg: DictConfig, hydra_cfg: DictConfig, identity: str, keep: bool = False
) -> resume.Decision | None:
    """The resume decision's read-only half (``litlab.storage.resume.find``) for the run ``cfg``; None
    for a debug run (``trainer.fast_dev_run``), which always starts fresh in the identity's folder."""
    if OmegaConf.select(cfg, "trainer.fast_dev_run", default=False):
        return None
    storage = RunStorage(str(cfg.storage.root), identity, storage_options(cfg.storage))
    return resume.find(str(cfg.resume), storage, start_record(cfg, hydra_cfg, run_settings(cfg)), keep=keep)


# Config groups that say where a run is stored or how a multirun is made, not what the run is (as
# NOT_SETTINGS): editing their files makes no new run.
_NOT_CODE_GROUPS = ("hydra", "paths", "storage", "sweep", "hparams_search")
_ENGINE_PACKAGE = "litlab"  # the engine's code and configs are not the user's (docs/storage.md)


def code_version(cfg: DictConfig, hydra_cfg: DictConfig) -> dict[str, Any]:
    """Content hashes of the user's code that composed ``cfg`` as ``hydra_cfg`` says, as run.json records
    them: its ``_target_``s' modules and what they import from the user's packages, and the config
    files Hydra chose (``{"fingerprint": ..., "files": {"configs/model/cnn.yaml": ..., ...}}``)."""

    content = _start_content(cfg, hydra_cfg)

    def record() -> dict[str, Any]:
        named = sorted([*_code_files(content[0]), *_config_files(hydra_cfg)])
        files = {name: hashlib.sha1(path.read_bytes()).hexdigest()[:16] for name, path in named}
        lines = "".join(f"{name}\t{digest}\n" for name, digest in files.items())
        return {"fingerprint": hashlib.sha1(lines.encode()).hexdigest(), "files": files}

    return once("code", content, record)


def _targets(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_" and isinstance(value, str):
                yield value
            else:
                yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


def _code_files(container: dict[str, Any]) -> list[tuple[str, Path]]:
    """The user's modules the ``_target_``s of ``container`` (the config without Hydra's node) name and
    every user module they import, with each package's ``__init__.py``: read (``ast``), not imported,
    so another task's file is not this run's code."""
    pending = [target for target in _targets(container) if not target.startswith("${")]
    roots: dict[str, Path | None] = {}
    files: dict[str, Path] = {}
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        top = module.partition(".")[0]
        if top not in roots:  # its folder (or a module's file) where it is the user's: not installed
            found = signatures.module_file(top) if top != _ENGINE_PACKAGE else None
            users = found is not None and not _installed(found)
            roots[top] = (found.parent if found.name == "__init__.py" else found) if users else None
        if module in seen or (root := roots[top]) is None:
            continue
        seen.add(module)
        pending += [module.rpartition(".")[0]] if "." in module else []  # its package's __init__.py runs
        path = signatures.module_file(module)  # None for a class named in its module (package.module.Class)
        if path is None:
            continue
        files[f"{top}/{path.relative_to(root).as_posix()}" if root.is_dir() else root.name] = path
        for node in ast.walk(signatures.parsed(path)):
            if isinstance(node, ast.Import):
                pending += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = signatures.imported_module(module, path.name == "__init__.py", node)
                pending += [base, *(f"{base}.{alias.name}" for alias in node.names)] if base else []
    return sorted(files.items())


@functools.cache  # sysconfig's and site's folders: fixed for the process
def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(r).resolve() for r in roots]


def _installed(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in _installed_roots())


def _config_files(hydra_cfg: DictConfig) -> list[tuple[str, Path]]:
    """The primary config file and the file of every group option Hydra chose, where the first
    search-path entry that has it is the user's; named from that entry's folder."""
    sources = [_source_folder(s.path, s.schema) for s in hydra_cfg.runtime.config_sources]
    wanted = [str(hydra_cfg.job.config_name)]
    for group, option in sorted(hydra_cfg.runtime.choices.items()):
        if str(group).split("/", 1)[0] in _NOT_CODE_GROUPS or option is None:
            continue
        options = option if isinstance(option, (list, tuple)) or OmegaConf.is_list(option) else [option]
        wanted += [f"{group}/{o}" for o in options]
    files: dict[str, Path] = {}
    while wanted:
        name = wanted.pop()
        for folder, users in sources:
            path = folder / f"{name}.yaml" if folder is not None else None
            if path is not None and path.is_file():
                if users and f"{folder.name}/{name}.yaml" not in files:
                    files[f"{folder.name}/{name}.yaml"] = path
                    wanted += _plain_defaults(path, name.rpartition("/")[0])
                break
    return sorted(files.items())


def _plain_defaults(path: Path, group: str) -> list[str]:
    """The configs a file's defaults list names without a group (not among Hydra's choices)."""
    try:
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except (yaml.YAMLError, AttributeError):
        return []
    names = []
    for entry in defaults if isinstance(defaults, list) else []:
        if not isinstance(entry, str) or entry == "_self_":
            continue
        entry = entry.removeprefix("optional ").split("@", 1)[0].strip()
        names.append(entry[1:] if entry.startswith("/") else f"{group}/{entry}".lstrip("/"))
    return names


def _source_folder(path: str, schema: str) -> tuple[Path | None, bool]:
    """A Hydra search-path entry's folder, and whether it holds the user's configs."""
    if schema == "file":
        folder = Path(path)
        return folder, not _installed(folder)
    if schema != "pkg":
        return None, False  # structured configs (schema): no file
    top, *inner = path.split(".")
    init = signatures.module_file(top)
    folder = init.parent.joinpath(*inner) if init and init.name == "__init__.py" else None
    return folder, top not in (_ENGINE_PACKAGE, "hydra") and folder is not None and not _installed(folder)
