"""Keys of every ``_target_`` node (``trainer`` too) checked against its target's signature, as
LightningCLI does, and values against plain annotations. The signature is read from the source with
``ast``, so that a typo fails before torch loads; the target is imported only where its source cannot tell.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from litlab.config.rules import ConfigError

# Hydra's node, and the engine's typed groups (litlab.config.schema: checked when composed).
_NOT_CHECKED = ("hydra", "precision", "storage", "paths", "oom", "tune")
_IMPLIED_TARGETS = {"trainer": "lightning.Trainer"}  # no `_target_`: litlab passes them to this class
_ENGINE_KEYS = {"strategy": ("name",)}  # read by litlab itself, never passed to the target
# lightning.Trainer arguments that litlab passes itself (a trainer key would pass them twice).
SET_BY_LITLAB = {
    "strategy": "from the strategy group: choose strategy=NAME",
    "precision": "from the precision group: choose precision=NAME",
    "callbacks": "from the callbacks group: choose callbacks=NAME or set callbacks.NAME.KEY",
    "logger": "from the logger group: choose logger=NAME",
    "plugins": "itself (its atomic checkpoint writer)",
    "enable_checkpointing": "from the callbacks group (true when it has a checkpoint callback)",
    "enable_progress_bar": "from the callbacks group (true when it has a progress bar)",
    "default_root_dir": "itself (the run's folder: set paths.log_dir to move it)",
}
# Targets that take ``**kwargs`` only to pass them on: (the callable that receives them, the
# arguments the target gives that callable itself). Checked by tests against the installed source.
KEYWORDS_PASSED_ON = {
    "lightning.pytorch.strategies.DDPStrategy": (
        "torch.nn.parallel.DistributedDataParallel",
        ("module", "device_ids"),
    ),
    "lightning.pytorch.strategies.FSDPStrategy": (
        "torch.distributed.fsdp.FullyShardedDataParallel",
        ("module", "device_id"),
    ),
}
# Decorators of an ``__init__`` that keep its signature: Lightning's, for PL_TRAINER_* defaults.
_SIGNATURE_KEEPING_DECORATORS = ("_defaults_from_env_vars",)
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
_PLAIN_TYPES = {t.__name__: t for t in (int, float, bool, str, list, tuple, dict)}
_PLAIN_TYPES |= {"List": list, "Tuple": tuple, "Dict": dict}

_Definition = tuple[ast.stmt, str]  # a class or function, and the module it is defined in
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Signature:
    """The keyword arguments a target accepts."""

    names: tuple[str, ...]
    any_keyword: bool  # it takes **kwargs: every key is accepted
    # The plain types each argument's annotation allows (those with other annotations are absent).
    types: dict[str, frozenset[type]] = field(default_factory=dict, compare=False, hash=False)


def check(cfg: DictConfig, overrides: list[str], config_dirs: list[Path]) -> None:
    """Raise ConfigError for the first key of a ``_target_`` node that its target does not accept,
    or whose value its annotation refuses."""
    where = functools.partial(_where, cfg, overrides=overrides, config_dirs=config_dirs)
    for path, node, target in _target_nodes(cfg):
        engine_keys = _ENGINE_KEYS.get(path, ())
        if target is None:  # `_target_: null` (strategy=auto): nothing is built from it
            key = next((f"{path}.{k}" for k in node if k not in _HYDRA_KEYS + engine_keys), None)
            if key:
                raise ConfigError(
                    f"unknown key '{key}' {where(key)}: {path} has _target_ null (nothing is built "
                    f"from it), so it takes only {', '.join(engine_keys) or 'no keys'}"
                )
            continue
        try:
            signature = signature_of(target) if isinstance(target, str) and target else None
        except (ImportError, AttributeError) as error:
            raise ConfigError(
                f"{path}._target_={target} {where(f'{path}._target_')} "
                f"cannot be imported ({type(error).__name__}: {error}): check the module and class name"
            ) from None
        for key in map(str, node) if signature else ():
            full_key = f"{path}.{key}"
            if path == "trainer" and key in SET_BY_LITLAB:
                raise ConfigError(
                    f"'{full_key}' {where(full_key)} is not allowed: litlab passes {target} its {key} "
                    f"{SET_BY_LITLAB[key]}"
                )
            if (key in _HYDRA_KEYS and path not in _IMPLIED_TARGETS) or key in engine_keys:
                continue
            if key in signature.names:
                _check_type(node, key, full_key, target, signature.types.get(key), where)
            elif not signature.any_keyword:
                accepted = [n for n in signature.names if not (path == "trainer" and n in SET_BY_LITLAB)]
                raise ConfigError(
                    f"unknown key '{full_key}' {where(full_key)}: {target} accepts "
                    f"{', '.join(accepted) or 'no arguments'}"
                )


def check_metric_is_logged(cfg: DictConfig) -> None:
    """A ConfigError when the source of the module and the callbacks tells that nothing logs
    ``optimized_metric``: every name they pass to ``self.log`` (``pl_module.log``) is text or an f-string
    (``f"{split}/acc"`` stands for any split), and none matches. Silent where the source cannot tell."""
    metric, logged = cfg.get("optimized_metric"), []
    if metric is None:
        return
    parts = [(cfg.model, "self"), *((c, "pl_module") for c in cfg.callbacks.values() if c is not None)]
    for node, owner in parts:
        target = node.get("_target_") if OmegaConf.is_dict(node) else None
        module, _, name = str(target).rpartition(".")
        found = _definition(module, name) if target and module else None
        names = _logged_names(found, owner) if found and isinstance(found[0], ast.ClassDef) else []
        if names is None or (owner == "self" and not names):  # a module that logs nothing itself: helpers
            return
        logged += names
    if any(re.fullmatch(pattern, metric) for pattern, _ in logged):
        return
    raise ConfigError(
        f"optimized_metric={metric} is logged nowhere: {cfg.model._target_} logs "
        f"{', '.join(dict.fromkeys(shown for _, shown in logged))} (its self.log calls); set "
        "optimized_metric to one of those (optimized_metric=null for a module that logs none)"
    )


def _logged_names(found: _Definition, owner: str, depth: int = 0) -> list[tuple[str, str]] | None:
    """(a pattern, as written) for each ``owner.log(name, ...)`` of a class and its bases up to
    Lightning's; None where a name is neither text nor an f-string, or a base is not found."""
    names = []
    for call in ast.walk(found[0]):
        function = call.func if isinstance(call, ast.Call) else None
        if not (isinstance(function, ast.Attribute) and getattr(function.value, "id", None) == owner):
            continue
        if function.attr == "log_dict":
            return None
        name = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
        if function.attr == "log":
            if not isinstance(name, (ast.Constant, ast.JoinedStr)):
                return None
            parts = name.values if isinstance(name, ast.JoinedStr) else [name]
            pattern = "".join(re.escape(str(p.value)) if isinstance(p, ast.Constant) else ".+" for p in parts)
            names.append((pattern, ast.unparse(name).removeprefix("f")[1:-1]))
    for base, definition in _bases(found, depth):
        if _name(base) in ("LightningModule", "Callback"):
            continue
        more = _logged_names(definition, owner, depth + 1) if definition else None
        if more is None:
            return None
        names += more
    return names


def _check_type(node: DictConfig, key: str, full_key: str, target: str, allowed: Any, where: Any) -> None:
    """A value its argument's plain annotation refuses (``trainer.max_epochs=abc``): one line."""
    child = node._get_node(key)
    if not allowed or child is None or child._is_interpolation() or child._is_missing():
        return
    if isinstance(child, DictConfig) and "_target_" in child:  # built into an object first: checked itself
        return
    value = OmegaConf.to_container(child) if OmegaConf.is_config(child) else child._value()
    if _type_allows(allowed, value):
        return
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value  # YAML's
    names = [*sorted(t.__name__ for t in allowed - {type(None)}), *["None"] * (type(None) in allowed)]
    raise ConfigError(
        f"{full_key}={shown} {where(full_key)} is not allowed: {target} takes {key} as {' or '.join(names)}"
    )


def _type_allows(allowed: frozenset[type], value: Any) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, never what an int argument means
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    if isinstance(value, list):
        return list in allowed or tuple in allowed
    return any(isinstance(value, kind) for kind in allowed if kind is not bool)


def _target_nodes(node: Any, path: str = "") -> Iterator[tuple[str, DictConfig, Any]]:
    """(dotted path, node, target) of every ``_target_`` node and ``trainer`` outside the schema groups
    and ``hydra``. Nodes reached through an interpolation (``${optimizer}``) are checked where they are."""
    if isinstance(node, DictConfig):
        if path in _IMPLIED_TARGETS:  # built by litlab itself: a `_target_` key there is unknown too
            yield path, node, _IMPLIED_TARGETS[path]
        elif "_target_" in node:
            yield path, node, node.get("_target_")
        keys = [k for k in node if path or str(k) not in _NOT_CHECKED]
    else:
        keys = range(len(node)) if isinstance(node, ListConfig) else []
    for key in keys:
        child = node._get_node(key)
        if child is not None and not child._is_interpolation() and not child._is_missing():
            yield from _target_nodes(child, f"{path}.{key}" if path else str(key))


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
    for name in ("experiment", "debug", "hparams_search", "sweep", "local", group):
        for config_dir in config_dirs if choices.get(name) else ():
            file = config_dir / name / f"{choices[name]}.yaml"
            if file.is_file() and (name == group or _file_sets(file, full_key)):
                return f"in {_shown(file)}"
    return f"in {group}={choices[group]}" if choices.get(group) else ""


def _file_sets(file: Path, key: str) -> bool:
    try:
        loaded = OmegaConf.load(file)
    except Exception:  # a file Hydra composed but OmegaConf alone cannot read: not the one to name
        return False
    return OmegaConf.select(loaded, key, default=None, throw_on_resolution_failure=False) is not None


def _shown(file: Path) -> str:
    return str(file.relative_to(Path.cwd()) if file.is_relative_to(Path.cwd()) else file)


# --- signatures, read from source ------------------------------------------------------------


@functools.cache
def signature_of(target: str) -> Signature | None:
    """The keyword arguments ``target`` accepts: from its source if possible, else by importing it.
    None when neither tells (the node is then not checked); ImportError or AttributeError when the
    target does not exist."""
    module, _, name = target.rpartition(".")
    if not module:
        return None
    found = _from_source(module, name, depth=0)
    found = found if found is not None else _from_import(module, name)
    if found is not None and found.any_keyword and target in KEYWORDS_PASSED_ON:
        receiver_name, given = KEYWORDS_PASSED_ON[target]
        receiver = signature_of(receiver_name)
        if receiver is not None:
            passed_on = [n for n in receiver.names if n not in given and n not in found.names]
            types = {n: t for n, t in receiver.types.items() if n in passed_on} | found.types
            return Signature(found.names + tuple(passed_on), receiver.any_keyword, types)
    return found


def _from_import(module: str, name: str) -> Signature | None:
    """Raises ImportError or AttributeError when the target does not exist."""
    obj = getattr(importlib.import_module(module), name)
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return None
    names = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Signature(names, any(p.kind is p.VAR_KEYWORD for p in parameters))


def _from_source(module: str, name: str, depth: int) -> Signature | None:
    found = _definition(module, name, depth)
    return _signature(found, depth) if found else None


def module_file(module: str) -> Path | None:
    """The source file of ``module`` (a package's ``__init__.py``), found without importing it."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not executed
    except (ImportError, ValueError):
        return None
    for part in parts[1:]:  # searched in its package's folders: find_spec would import the package
        folders = spec and spec.origin and spec.submodule_search_locations
        spec = importlib.machinery.PathFinder.find_spec(f"{spec.name}.{part}", folders) if folders else None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def parsed(path: Path) -> ast.Module:
    """The module's syntax tree; an empty one where it cannot be read or parsed."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ast.Module(body=[], type_ignores=[])


@functools.cache
def _module_tree(module: str) -> tuple[ast.Module, bool] | None:
    """The parsed source of ``module`` and whether it is a package, found without importing it."""
    origin = module_file(module)
    return (parsed(origin), origin.name == "__init__.py") if origin else None


def imported_module(module: str, is_package: bool, statement: ast.ImportFrom) -> str | None:
    """The absolute name of the module a ``from ... import`` statement of ``module`` reads."""
    if not statement.level:
        return statement.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (statement.level - 1)]
    if not base:
        return None
    return ".".join(base + ([statement.module] if statement.module else []))


def _top_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements at module level, including those inside ``if``/``try`` blocks there."""
    for statement in statements:
        yield statement
        if isinstance(statement, (ast.If, ast.Try)):
            yield from _top_level(statement.body + statement.orelse + getattr(statement, "finalbody", []))


def _definition(module: str, name: str, depth: int = 0) -> _Definition | None:
    """Where ``module.name`` is defined in source, following imports, without importing it; ``name``
    may go through an imported module (``nn.Module``)."""
    tree = _module_tree(module) if depth < 10 else None
    if tree is None:
        return None
    head, _, rest = name.partition(".")
    for statement in _top_level(tree[0].body):
        if isinstance(statement, (*_FUNCTIONS, ast.ClassDef)) and statement.name == name:
            return statement, module
        for alias in statement.names if isinstance(statement, (ast.Import, ast.ImportFrom)) else []:
            if (alias.asname or alias.name) != head:
                continue
            if isinstance(statement, ast.Import):  # `import torch.nn as nn`: nn.Module
                return _definition(alias.name, rest, depth + 1) if rest else None
            source = imported_module(module, tree[1], statement)
            if source and rest:  # `from torch import nn`: nn.Module
                return _definition(f"{source}.{alias.name}", rest, depth + 1)
            return _definition(source, alias.name, depth + 1) if source else None
    return None


def _bases(found: _Definition, depth: int) -> Iterator[tuple[ast.expr, _Definition | None]]:
    """Each base of a class, and where it is defined (None where the source does not tell)."""
    for base in found[0].bases:
        name = ast.unparse(base) if isinstance(base, (ast.Name, ast.Attribute)) else None
        definition = _definition(found[1], name, depth + 1) if name else None
        yield base, definition if definition and isinstance(definition[0], ast.ClassDef) else None


def _signature(found: _Definition, depth: int) -> Signature | None:
    node = found[0]
    if node.decorator_list:  # a dataclass or a decorator that may change the signature: import it
        return None
    if not isinstance(node, ast.ClassDef):
        return _arguments(node.args, skip_first=False)
    methods = {s.name: s for s in node.body if isinstance(s, _FUNCTIONS)}
    method = methods.get("__init__") or methods.get("__new__")
    if method is not None:
        if any(_name(d) not in _SIGNATURE_KEEPING_DECORATORS for d in method.decorator_list):
            return None
        return _arguments(method.args, skip_first=True)
    # No __init__ of its own: the first base that defines one.
    inherited = (_signature(definition, depth + 1) for _, definition in _bases(found, depth) if definition)
    return next((signature for signature in inherited if signature is not None), None)


def _name(node: ast.expr) -> str | None:
    """The last name of a decorator, a base or an annotation (``functools.wraps(f)``: wraps)."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def _arguments(arguments: ast.arguments, skip_first: bool) -> Signature:
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + arguments.defaults
    # Positional-only arguments (and self) are not passed by name.
    pairs = list(zip(positional, defaults, strict=True))[max(len(arguments.posonlyargs), int(skip_first)) :]
    pairs += list(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))
    types = {}
    for argument, default in pairs:
        allowed = _annotation_types(argument.annotation)
        if argument.annotation is None and isinstance(getattr(default, "value", None), bool):
            allowed = frozenset({bool})  # `static_graph=False`: a switch
        if allowed is not None:
            none_default = isinstance(default, ast.Constant) and default.value is None
            types[argument.arg] = allowed | {type(None)} if none_default else allowed
    return Signature(tuple(a.arg for a, _ in pairs), arguments.kwarg is not None, types)


def _annotation_types(annotation: ast.expr | None) -> frozenset[type] | None:
    """The plain types an annotation allows (``Optional[int]``: int and None); None when it names
    anything else, so that the value is not checked (``Union[str, timedelta]``, a class, an alias)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Constant):
        return frozenset({type(None)}) if annotation.value is None else None
    outer = _name(annotation.value) if isinstance(annotation, ast.Subscript) else None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        members = [annotation.left, annotation.right]
    elif outer in ("Optional", "Union"):
        inner = annotation.slice
        members = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        members += [ast.Constant(None)] if outer == "Optional" else []
    else:  # `int`, or `list[int]`: a list (its items are not checked)
        plain = _PLAIN_TYPES.get(outer or _name(annotation) or "")
        return frozenset({plain}) if plain else None
    types = [_annotation_types(member) for member in members]
    return None if None in types else frozenset().union(*types)
