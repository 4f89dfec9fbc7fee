"""Keys of every ``_target_`` node checked against its target's signature, before anything runs.

As LightningCLI does, for your groups and the engine's, and for ``trainer`` against
``lightning.Trainer`` (``IMPLIED_TARGETS``): a typo fails in one line naming the key, its file and the
accepted keys, and a value is checked against a plain annotation. The signature is read from the
target's source with ``ast``, without importing torch, and imported only where the source cannot tell.
A ``**kwargs`` target accepts any key unless ``KEYWORDS_PASSED_ON`` names where its keywords go.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from litlab.config.rules import ConfigError

# Engine groups with a typed schema (litlab.config.schema): checked when composed, not here.
SCHEMA_GROUPS = ("precision", "storage", "paths", "oom", "tune")
# Nodes without a ``_target_`` key that litlab passes to one class as its keyword arguments.
IMPLIED_TARGETS = {"trainer": "lightning.Trainer"}
# Keys litlab reads itself in a ``_target_`` node, never passed to the target.
ENGINE_KEYS = {"strategy": ("name",)}
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
# Decorators of an ``__init__`` that keep its signature (functools.wraps): Lightning's, which reads
# the Trainer's defaults from PL_TRAINER_* environment variables.
SIGNATURE_KEEPING_DECORATORS = ("_defaults_from_env_vars",)
# Keys that Hydra's instantiate reads itself.
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
_PLAIN_TYPES = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "list": list,
    "List": list,
    "tuple": tuple,
    "Tuple": tuple,
    "dict": dict,
    "Dict": dict,
    "None": type(None),
}


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
        engine_keys = ENGINE_KEYS.get(path, ())
        if target is None:  # `_target_: null` (strategy=auto): nothing is built from it
            for key in node:
                if str(key) not in _HYDRA_KEYS and str(key) not in engine_keys:
                    full_key = f"{path}.{key}"
                    raise ConfigError(
                        f"unknown key '{full_key}' {where(full_key)}: {path} has _target_ null (nothing "
                        f"is built from it), so it takes only {', '.join(engine_keys) or 'no keys'}"
                    )
            continue
        if not isinstance(target, str) or not target:
            continue
        try:
            signature = signature_of(target)
        except (ImportError, AttributeError) as error:
            raise ConfigError(
                f"{path}._target_={target} {where(f'{path}._target_')} "
                f"cannot be imported ({type(error).__name__}: {error}): check the module and class name"
            ) from None
        if signature is None:
            continue
        for key in node:
            key = str(key)
            full_key = f"{path}.{key}"
            if path == "trainer" and key in SET_BY_LITLAB:
                raise ConfigError(
                    f"'{full_key}' {where(full_key)} is not allowed: litlab passes {target} its {key} "
                    f"{SET_BY_LITLAB[key]}"
                )
            if (key in _HYDRA_KEYS and path not in IMPLIED_TARGETS) or key in engine_keys:
                continue
            if key in signature.names:
                _check_type(node, key, full_key, target, signature, where)
            elif not signature.any_keyword:
                accepted = ", ".join(_accepted(path, signature)) or "no arguments"
                raise ConfigError(f"unknown key '{full_key}' {where(full_key)}: {target} accepts {accepted}")


def check_metric_is_logged(cfg: DictConfig) -> None:
    """A ConfigError when the source of the module and the callbacks tells that nothing logs
    ``optimized_metric``: every name they pass to ``self.log`` (``pl_module.log``) is text or an f-string
    (``f"{split}/acc"`` stands for any split), and none matches. Silent where the source cannot tell."""
    metric, logged = cfg.get("optimized_metric"), []
    parts = [(cfg.model, "self"), *((c, "pl_module") for c in cfg.callbacks.values() if c is not None)]
    for node, owner in parts:
        target = node.get("_target_") if OmegaConf.is_dict(node) else None
        module, _, name = str(target).rpartition(".")
        found = _definition(module, name, 0) if target and module else None
        names = _logged_names(found, owner) if found and isinstance(found[0], ast.ClassDef) else []
        if names is None or (owner == "self" and not names):  # a module that logs nothing itself: helpers
            return
        logged += names
    if metric is None or any(re.fullmatch(pattern, metric) for pattern, _ in logged):
        return
    raise ConfigError(
        f"optimized_metric={metric} is logged nowhere: {cfg.model._target_} logs "
        f"{', '.join(dict.fromkeys(shown for _, shown in logged))} (its self.log calls); set "
        "optimized_metric to one of those (optimized_metric=null for a module that logs none)"
    )


def _logged_names(found: Definition, owner: str, depth: int = 0) -> list[tuple[str, str]] | None:
    """(a pattern, as written) for each ``owner.log(name, ...)`` of a class and its bases up to
    Lightning's; None where a name is neither text nor an f-string, or a base is not found."""
    node, module, tree, is_package = found
    names = []
    for call in ast.walk(node):
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
    for base in node.bases:
        if _decorator_name(base) in ("LightningModule", "Callback"):
            continue
        found = _base(base, module, tree, is_package, depth)
        more = (
            _logged_names(found, owner, depth + 1) if found and isinstance(found[0], ast.ClassDef) else None
        )
        if more is None:
            return None
        names += more
    return names


def _accepted(path: str, signature: Signature) -> list[str]:
    """The keys a node at ``path`` may set: its target's arguments less those litlab passes itself."""
    return [name for name in signature.names if not (path == "trainer" and name in SET_BY_LITLAB)]


def _check_type(
    node: DictConfig, key: str, full_key: str, target: str, signature: Signature, where: Any
) -> None:
    """A value its argument's plain annotation refuses (``trainer.max_epochs=abc``): one line."""
    allowed = signature.types.get(key)
    child = node._get_node(key)
    if not allowed or child is None or child._is_interpolation() or child._is_missing():
        return
    if isinstance(child, DictConfig):
        if "_target_" in child:  # built into an object first: its own node is checked
            return
        value: Any = dict(child)
    elif isinstance(child, ListConfig):
        value = list(child)
    else:
        value = child._value()
    if not _type_allows(allowed, value):
        shown = OmegaConf.to_container(child) if OmegaConf.is_config(child) else _yaml(value)
        names = " or ".join([*sorted(t.__name__ for t in allowed if t is not type(None)), "None"])
        names = names if type(None) in allowed else names.removesuffix(" or None")
        raise ConfigError(
            f"{full_key}={shown} {where(full_key)} is not allowed: {target} takes {key} as {names}"
        )


def _yaml(value: Any) -> str:
    """A plain value as it is written in YAML and on the command line."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _type_allows(allowed: frozenset[type], value: Any) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, never what an int argument means
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    if isinstance(value, list):
        return list in allowed or tuple in allowed
    return any(isinstance(value, kind) for kind in allowed if kind is not bool)


def _target_nodes(cfg: DictConfig) -> list[tuple[str, DictConfig, Any]]:
    """(dotted path, node, target) of every ``_target_`` node and ``IMPLIED_TARGETS`` node outside
    the schema groups and ``hydra``. Nodes reached through an interpolation (``optimizer:
    ${optimizer}``) are checked where they are."""
    found: list[tuple[str, DictConfig, Any]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, DictConfig):
            if path in IMPLIED_TARGETS:  # built by litlab itself: a `_target_` key there is unknown too
                found.append((path, node, IMPLIED_TARGETS[path]))
            elif "_target_" in node:
                found.append((path, node, node.get("_target_")))
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


def module_file(module: str) -> Path | None:
    """The source file of ``module`` (a package's ``__init__.py``), found without importing it."""
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
    return origin if origin.suffix == ".py" else None


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


Definition = tuple[ast.stmt, str, ast.Module, bool]  # a class or function, its module, tree, package


def _definition(module: str, name: str, depth: int) -> Definition | None:
    """Where ``module.name`` is defined in source (following ``from ... import``), without importing it."""
    parsed = _module_tree(module) if depth < 10 else None
    if parsed is None:
        return None
    tree, is_package = parsed
    for statement in _top_level(tree):
        if (
            isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and statement.name == name
        ):
            return statement, module, tree, is_package
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    source = imported_module(module, is_package, statement)
                    return _definition(source, alias.name, depth + 1) if source else None
    return None


def _from_source(module: str, name: str, depth: int) -> Signature | None:
    found = _definition(module, name, depth)
    if found is None:
        return None
    if isinstance(found[0], ast.ClassDef):
        return _class(*found, depth)
    return None if found[0].decorator_list else _arguments(found[0].args, skip_first=False)


def imported_module(module: str, is_package: bool, statement: ast.ImportFrom) -> str | None:
    """The absolute name of the module a ``from ... import`` statement of ``module`` reads."""
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
    for method in ("__init__", "__new__"):
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == method:
                if any(
                    _decorator_name(d) not in SIGNATURE_KEEPING_DECORATORS for d in statement.decorator_list
                ):
                    return None
                return _arguments(statement.args, skip_first=True)
    for base in node.bases:  # no __init__ of its own: the first base that defines one
        found = _base(base, module, tree, is_package, depth)
        signature = _class(*found, depth + 1) if found and isinstance(found[0], ast.ClassDef) else None
        if signature is not None:
            return signature
    return None


def _decorator_name(decorator: ast.expr) -> str | None:
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Name):
        return decorator.id
    return decorator.attr if isinstance(decorator, ast.Attribute) else None


def _base(base: ast.expr, module: str, tree: ast.Module, is_package: bool, depth: int) -> Definition | None:
    if isinstance(base, ast.Name):
        return _definition(module, base.id, depth + 1)
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):  # nn.Module, L.LightningModule
        alias = base.value.id
        for statement in _top_level(tree):
            imports = statement.names if isinstance(statement, (ast.Import, ast.ImportFrom)) else []
            for imported in imports:
                if (imported.asname or imported.name) != alias:
                    continue
                if isinstance(statement, ast.Import):
                    return _definition(imported.name, base.attr, depth + 1)
                source = imported_module(module, is_package, statement)
                return _definition(f"{source}.{imported.name}", base.attr, depth + 1) if source else None
    return None


def _arguments(arguments: ast.arguments, skip_first: bool) -> Signature:
    positional = arguments.posonlyargs + arguments.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
    pairs = list(zip(positional, defaults + arguments.defaults, strict=True))[1 if skip_first else 0 :]
    pairs = [(a, d) for a, d in pairs if a not in arguments.posonlyargs]  # not passed by name
    pairs += list(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))
    types = {}
    for argument, default in pairs:
        allowed = _annotation_types(argument.annotation)
        if (
            argument.annotation is None
            and isinstance(default, ast.Constant)
            and isinstance(default.value, bool)
        ):
            allowed = frozenset({bool})  # `static_graph=False`: a switch
        if allowed is not None:
            none_default = isinstance(default, ast.Constant) and default.value is None
            types[argument.arg] = allowed | {type(None)} if none_default else allowed
    return Signature(tuple(a.arg for a, _ in pairs), arguments.kwarg is not None, types)


def _annotation_types(annotation: ast.expr | None) -> frozenset[type] | None:
    """The plain types an annotation allows (``Optional[int]``: int and None); None when it names
    anything else, so that the value is not checked (``Union[str, timedelta]``, a class, an alias)."""
    if isinstance(annotation, ast.Constant):
        if annotation.value is None:
            return frozenset({type(None)})
        if isinstance(annotation.value, str):  # a quoted annotation
            try:
                return _annotation_types(ast.parse(annotation.value, mode="eval").body)
            except SyntaxError:
                return None
        return None
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        plain = _PLAIN_TYPES.get(_decorator_name(annotation) or "")
        return frozenset({plain}) if plain else None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _union([annotation.left, annotation.right])
    if isinstance(annotation, ast.Subscript):
        outer = _decorator_name(annotation.value)
        inner = annotation.slice
        members = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        if outer == "Optional":
            return _union([*members, ast.Constant(None)])
        if outer == "Union":
            return _union(members)
        if outer in _PLAIN_TYPES:  # list[int]: a list (its items are not checked)
            return frozenset({_PLAIN_TYPES[outer]})
    return None


def _union(members: list[ast.expr]) -> frozenset[type] | None:
    allowed: set[type] = set()
    for member in members:
        types = _annotation_types(member)
        if types is None:
            return None
        allowed |= types
    return frozenset(allowed)
