"""A run's identity: the name its folder, its resume point and its lock are found by; and the
version of the user's code (``code_version``) that makes a changed model a new run.

Nothing here imports torch: the preflight computes the identity to check the run's lock before torch
loads, Hydra names the run's folder (``run_folder``) before the run starts, and hashing the code
reads a few files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import site
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

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


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    """What a run trains, resolved: every config value but where it is stored, logged and how it
    is launched (``NOT_SETTINGS``), as ``{"trainer.max_epochs": 3, ...}``. ``optimizer.lr=0.002``
    and ``2e-3`` are one setting; a sweep file's fixed values are settings like any other."""
    container = OmegaConf.to_container(cfg, resolve=False)
    settings: dict[str, Any] = {}

    def walk(node: Any, key: str) -> None:
        if is_credential_key(key.rpartition(".")[2]):
            settings[key] = REDACTED  # written in summary.json; a new password is not a new run
        elif isinstance(node, dict) and node:
            for name, value in node.items():
                walk(value, f"{key}.{name}" if key else str(name))
        elif _resolves_to_a_setting(node):
            try:
                value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
                settings[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            except Exception:  # OmegaConf's errors: a value that resolves only in the run counts as written
                settings[key] = node
        else:
            settings[key] = node

    for name, value in container.items():
        if name not in NOT_SETTINGS:
            walk(value, str(name))
    return dict(sorted(settings.items()))


def _resolves_to_a_setting(node: Any) -> bool:
    """An interpolation whose value is a setting: not a location, the environment, nor a whole node
    (``${optimizer}``, a setting of its own)."""
    return (
        isinstance(node, str)
        and "${" in node
        and not (_KEPT_AS_TEXT.search(node) or _ONE_NODE.fullmatch(node))
    )


def settings_fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def run_identity(cfg: DictConfig, settings: dict[str, Any] | None = None) -> str:
    """``run_name``, or the experiment name plus a hash of the run's settings (``run_settings``, or
    ``settings`` where the caller has them): two commands that train the same are one run, two that
    train differently never are."""
    if cfg.run_name:
        return str(cfg.run_name)
    return f"{cfg.experiment_name}-{settings_fingerprint(settings or run_settings(cfg))[:10]}"


def run_folder(cfg: DictConfig) -> str:
    """The name of the run's folder, under ``<log dir>/<task>/runs/`` and under the storage root: its
    identity, or, once that run completed with other code, this code's version of it (``found_in_storage``,
    kept for the start's resume decision). ``cfg`` holds Hydra's node.

    Every rank, every restart and every requeue of one command computes the same name from the
    command and the storage, so ranks need not agree on it and a requeued job finds its folder.
    """
    identity = run_identity(cfg)
    try:
        found = found_in_storage(cfg, cfg.hydra, identity, keep=True)
    except Exception as error:  # fsspec's, botocore's, an uninstalled backend's: each raises its own
        # Storage that cannot be read: the run's start says why in one line (check_storage).
        log.debug("run folder of %s named without its storage (%s)", identity, error)
        return identity
    return found.folder.identity if found is not None else identity


def found_in_storage(
    cfg: DictConfig, hydra_cfg: DictConfig, identity: str, keep: bool = False
) -> resume.Decision | None:
    """The resume decision's read-only half (``litlab.storage.resume.find``) for the run ``cfg``
    (``identity``: ``run_identity(cfg)``) composed as ``hydra_cfg`` says: its storage folder for the
    user's code as it is now, and the summary of a run that completed there; None for a debug run
    (``trainer.fast_dev_run``), which always starts fresh in the identity's folder."""
    if OmegaConf.select(cfg, "trainer.fast_dev_run", default=False):
        return None
    storage = RunStorage(str(cfg.storage.root), identity, storage_options(cfg.storage))
    return resume.find(str(cfg.resume), storage, code_version(cfg, hydra_cfg).record(), keep=keep)


# Config groups that say where a run is stored or how a multirun is made, not what the run is (as
# NOT_SETTINGS): editing their files makes no new run.
_NOT_CODE_GROUPS = ("hydra", "paths", "storage", "sweep", "hparams_search")
ENGINE_PACKAGE = "litlab"  # the engine's code and configs are not the user's (docs/storage.md)


@dataclass(frozen=True)
class CodeVersion:
    """Content hashes of the user's code that composed a run: the packages its ``_target_``s live in
    (not installed ones, not the engine) and the config files Hydra chose, by name
    (``project/vision/module.py``, ``configs/model/cnn.yaml``)."""

    files: dict[str, str]

    @property
    def fingerprint(self) -> str:
        lines = "".join(f"{name}\t{digest}\n" for name, digest in sorted(self.files.items()))
        return hashlib.sha1(lines.encode()).hexdigest()

    def record(self) -> dict[str, Any]:
        """What the run's storage folder records (run.json), to compare a later start with."""
        return {"fingerprint": self.fingerprint, "files": dict(sorted(self.files.items()))}


def code_version(cfg: DictConfig, hydra_cfg: DictConfig) -> CodeVersion:
    """The user's code as it is now, for the config ``cfg`` that Hydra composed as ``hydra_cfg`` says."""
    files: dict[str, str] = {}
    for package in sorted(_user_packages(cfg)):
        for name, path in _package_files(package):
            files[name] = _file_hash(path)
    for name, path in _config_files(hydra_cfg):
        files[name] = _file_hash(path)
    return CodeVersion(files)


def _file_hash(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()[:16]


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


def _user_packages(cfg: DictConfig) -> set[str]:
    """Top-level names of the modules the ``_target_``s live in, but the engine's."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)  # a config composed with Hydra's own node (tests): not the task's
    tops = {t.split(".", 1)[0] for t in _targets(container) if not t.startswith("${")}
    return {top for top in tops if top and top != ENGINE_PACKAGE and top.isidentifier()}


def _package_files(top: str) -> list[tuple[str, Path]]:
    """The ``.py`` files of a top-level package or module that is not installed (nor the standard
    library), named from the package (``project/vision/module.py``). ``find_spec`` of a top-level
    name imports nothing."""
    spec = _spec(top)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        found = []
        for location in spec.submodule_search_locations:
            folder = Path(location)
            if folder.is_dir() and not _installed(folder):
                found += [(f"{top}/{p.relative_to(folder).as_posix()}", p) for p in folder.rglob("*.py")]
        return sorted(found)
    origin = Path(spec.origin) if spec.origin and spec.has_location else None
    if origin is None or not origin.is_file() or _installed(origin):
        return []
    return [(origin.name, origin)]


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
    search-path entry that has it is the user's (a folder, or a package that is not installed or
    the engine); named from that entry's folder (``configs/model/cnn.yaml``)."""
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
    """The configs a file's defaults list names without a group (``- checkpoint`` in
    ``callbacks/default.yaml``): not among Hydra's choices, they are found here."""
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
    folder = _package_folder(top, inner)
    return folder, top not in (ENGINE_PACKAGE, "hydra") and folder is not None and not _installed(folder)


def _package_folder(top: str, inner: list[str]) -> Path | None:
    spec = _spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]).joinpath(*inner)


def _spec(top: str) -> Any:
    """The import spec of a top-level name (importlib.machinery.ModuleSpec), found without importing it."""
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
