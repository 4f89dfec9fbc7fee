"""Keys of your groups checked against the signature of their ``_target_``, before anything runs.

Your groups (model, data, optimizer, scheduler, and the engine's callbacks and logger entries) have
no schema: a key is right when the class or function its node's ``_target_`` names accepts it. So
adding an option to your code needs no schema code, and a typo (``model.net.hiden=3``) fails with
one line naming the key, the file it is in and the keys that are accepted.

The signature is read from the target's source with ``ast``, without importing it: a typo then fails
in well under a second, with no torch or Lightning import (following ``from x import y``
re-exports, base classes and ``functools.partial``-style ``_partial_`` nodes). Where the source
cannot be read that way (a compiled module, an assignment, a decorator that changes the signature)
the target is imported and inspected instead, which costs that module's import. A target that
accepts ``**kwargs`` accepts any key, so its node is not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from litlab.config.rules import ConfigError

# Engine groups with a typed schema (litlab.config.schema): checked when composed, not here.
SCHEMA_GROUPS = ("trainer", "strategy", "precision", "storage", "paths", "oom", "tune")
# Keys that Hydra's instantiate reads itself.
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")


@dataclass(frozen=True)
class Signature:
    """The keyword arguments a target accepts."""

    names: tuple[str, ...]
    any_keyword: bool  # it takes **kwargs: every key is accepted


def check(cfg: DictConfig, overrides: list[str], config_dirs: list[Path]) -> None:
    """Raise ConfigError for the first key of a ``_target_`` node that its target does not accept."""
    for path, node in _target_nodes(cfg):
        target = node.get("_target_")
        if not isinstance(target, str) or not target:
            continue
        try:
            signature = signature_of(target)
        except (ImportError, AttributeError) as error:
            raise ConfigError(
                f"{path}._target_={target} {_where(cfg, f'{path}._target_', overrides, config_dirs)} "
                f"cannot be imported ({type(error).__name__}: {error}): check the module and class name"
            ) from None
        if signature is None or signature.any_keyword:
            continue
        for key in node:
            key = str(key)
            if key in _HYDRA_KEYS or key in signature.names:
                continue
            full_key = f"{path}.{key}"
            accepted = ", ".join(signature.names) or "no arguments"
            raise ConfigError(
                f"unknown key '{full_key}' {_where(cfg, full_key, overrides, config_dirs)}: "
                f"{target} accepts {accepted}"
            )


def _target_nodes(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """(dotted path, node) of every ``_target_`` node outside the schema groups and ``hydra``.
    Nodes reached through an interpolation (``optimizer: ${optimizer}``) are checked where they are."""
    found: list[tuple[str, DictConfig]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, DictConfig):
            if "_target_" in node:
                found.append((path, node))
            items = [(str(k), node._get_node(k)) for k in node]
        elif isinstance(node, ListConfig):
            items = [(str(i), node._get_node(i)) for i in range(len(node))]
        else:
            return
        for key, child in items:
            if child is None or child._is_interpolation() or child._is_missing():
                continue
            walk(child if isinstance(child, (DictConfig, ListConfig)) else None, f"{path}.{key}")

    for key in cfg:
        key = str(key)
        if key == "hydra" or key in SCHEMA_GROUPS:
            continue
        child = cfg._get_node(key)
        if child is not None and not child._is_interpolation() and not child._is_missing():
            walk(child, key)
    return found


def _where(cfg: DictConfig, full_key: str, overrides: list[str], config_dirs: list[Path]) -> str:
    """Where the key was written: the command line, an experiment-like file, or the group's file."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        # `model=mlp` picks a file; `model.net.x=1` (or `model.net={...}`) writes the key itself.
        if key == full_key or ("." in key and full_key.startswith(f"{key}.")):
            return "on the command line"
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    group = full_key.split(".", 1)[0]
    # Files of `# @package _global_` groups can set any key; the group's own option file comes last.
    for name, relative in [
        (g, full_key) for g in ("experiment", "debug", "hparams_search", "sweep", "local")
    ] + [(group, full_key.split(".", 1)[1])]:
        choice = choices.get(name)
        if not choice:
            continue
        for config_dir in config_dirs:
            file = config_dir / name / f"{choice}.yaml"
            if file.is_file() and (name == group or _file_sets(file, relative)):
                return f"in {_shown(file)}"
    return f"in {group}={choices.get(group)}" if choices.get(group) else ""


def _file_sets(file: Path, key: str) -> bool:
    try:
        loaded = OmegaConf.load(file)
    except Exception:  # a file Hydra composed but OmegaConf alone cannot read: not the one to name
        return False
    return OmegaConf.select(loaded, key, default=None, throw_on_resolution_failure=False) is not None


def _shown(file: Path) -> str:
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)


# --- signatures ------------------------------------------------------------------------------


@functools.cache
def signature_of(target: str) -> Signature | None:
    """The keyword arguments ``target`` accepts: from its source if possible, else by importing it.
    None when neither tells (the node is then not checked); ImportError or AttributeError when the
    target does not exist."""
    module, _, name = target.rpartition(".")
    if not module:
        return None
    found = _from_source(module, name, depth=0)
    return found if found is not None else _from_import(module, name)


def _from_import(module: str, name: str) -> Signature | None:
    """Raises ImportError or AttributeError when the target does not exist."""
    obj = getattr(importlib.import_module(module), name)
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return None
    names = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Signature(names, any(p.kind is p.VAR_KEYWORD for p in parameters))


@functools.cache
def _module_tree(module: str) -> tuple[ast.Module, bool] | None:
    """The parsed source of ``module`` and whether it is a package, found without importing it."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not executed
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin, locations = Path(spec.origin), list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        for location in locations:
            package, plain = Path(location) / part / "__init__.py", Path(location) / f"{part}.py"
            if package.is_file():
                origin, locations = package, [str(package.parent)]
                break
            if plain.is_file():
                origin, locations = plain, []
                break
        else:
            return None
    if origin.suffix != ".py":
        return None
    try:
        return ast.parse(origin.read_text(encoding="utf-8")), origin.name == "__init__.py"
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements at module level, including those inside ``if``/``try`` blocks there."""
    statements: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        statement = pending.pop(0)
        statements.append(statement)
        if isinstance(statement, ast.If):
            pending[:0] = statement.body + statement.orelse
        elif isinstance(statement, ast.Try):
            pending[:0] = statement.body + statement.orelse + statement.finalbody
    return statements


def _from_source(module: str, name: str, depth: int) -> Signature | None:
    parsed = _module_tree(module) if depth < 10 else None
    if parsed is None:
        return None
    tree, is_package = parsed
    for statement in _top_level(tree):
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            return None if statement.decorator_list else _arguments(statement.args, skip_first=False)
        if isinstance(statement, ast.ClassDef) and statement.name == name:
            return _class(statement, module, tree, is_package, depth)
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    source = _imported_module(module, is_package, statement)
                    return _from_source(source, alias.name, depth + 1) if source else None
    return None


def _imported_module(module: str, is_package: bool, statement: ast.ImportFrom) -> str | None:
    if not statement.level:
        return statement.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (statement.level - 1)]
    if not base:
        return None
    return ".".join(base + ([statement.module] if statement.module else []))


def _class(
    node: ast.ClassDef, module: str, tree: ast.Module, is_package: bool, depth: int
) -> Signature | None:
    if node.decorator_list:  # a dataclass or a decorator that may change the signature: import it
        return None
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == "__init__":
            return None if statement.decorator_list else _arguments(statement.args, skip_first=True)
    for base in node.bases:  # no __init__ of its own: the first base that defines one
        found = _base(base, module, tree, is_package, depth)
        if found is not None:
            return found
    return None


def _base(base: ast.expr, module: str, tree: ast.Module, is_package: bool, depth: int) -> Signature | None:
    if isinstance(base, ast.Name):
        return _from_source(module, base.id, depth + 1)
    if isinstance(base, ast.Attribute) and isinstance(
        base.value, ast.Name
    ):  # e.g. nn.Module, L.LightningModule
        alias = base.value.id
        for statement in _top_level(tree):
            if isinstance(statement, ast.Import):
                for imported in statement.names:
                    if (imported.asname or imported.name) == alias:
                        return _from_source(imported.name, base.attr, depth + 1)
            if isinstance(statement, ast.ImportFrom):
                for imported in statement.names:
                    if (imported.asname or imported.name) == alias:
                        source = _imported_module(module, is_package, statement)
                        return (
                            _from_source(f"{source}.{imported.name}", base.attr, depth + 1)
                            if source
                            else None
                        )
    return None


def _arguments(arguments: ast.arguments, skip_first: bool) -> Signature:
    positional = [a.arg for a in arguments.args]
    if skip_first and positional:
        positional = positional[1:]
    names = tuple(positional + [a.arg for a in arguments.kwonlyargs])
    return Signature(names, arguments.kwarg is not None)
