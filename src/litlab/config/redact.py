"""Credentials stay in the environment: what litlab writes or logs shows a value read through
``oc.env`` as its interpolation, and a URL's user-info and the value of a key that names a credential
as ``***``; the run uses the real values. The rules: docs/loggers.md.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf, flag_override
from omegaconf.errors import OmegaConfBaseException

from litlab.errors import first_line
from litlab.logs import global_rank

log = logging.getLogger(__name__)

REDACTED = "***"

# A URL's user-info: what lies between "scheme://" (or Hydra's escaped "scheme\://") and "@" before the host.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*\\?://)(?P<userinfo>[^\s/@?#]+)@")
# A database URL (SQLAlchemy's dialect[+driver]) names its user there, the password set elsewhere
# (PGPASSWORD, ~/.pgpass): a user name alone is no credential; elsewhere it can be a token.
_DATABASE_SCHEME = re.compile(r"(?:postgres(?:ql)?|mysql|mariadb|mssql|oracle|cockroachdb)(?:\+\w+)?\\?://")
# An override (``+key@package=value``), or the first of Hydra's comma-joined ones (override_dirname).
_OVERRIDE = re.compile(r"^[+~]{0,2}(?P<key>[A-Za-z_][\w.@/-]*)=")
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")
_HYDRA_ESCAPE = re.compile(r"\\([\\()\[\]{}:=, \t])")
_READS_ENVIRONMENT = re.compile(r"\$\{\s*oc\.env\s*:")
_PURE_ENV_REFERENCE = re.compile(r"^\$\{oc\.env:\s*[A-Za-z_][A-Za-z0-9_]*\s*\}$")
# On the key in snake_case: substrings for the unambiguous names, a word ending in "token" for tokens.
_CREDENTIAL_KEY = re.compile(
    r"password|passwd|secret|credential|api_?key|access_?key|account_?key|connection_?string"
    r"|(?:^|_)[a-z0-9]*token(?:_|$)"
)
# Stands for an environment value while finding which values depend on one (no config text has it).
_ENV_MARK = "\x00litlab-environment\x00"

# What a credential is written as: (the secret as it is written, its key) -> its replacement.
_Replace = Callable[[Any, Any], Any]
_REDACTED: _Replace = lambda secret, key: REDACTED  # noqa: E731


def is_credential_key(key: Any) -> bool:
    """Whether a config key names a credential (``_CREDENTIAL_KEY``, on the key in snake_case)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key)).lower().replace("-", "_")
    return bool(_CREDENTIAL_KEY.search(snake))


def redact_text(text: str) -> str:
    """``text`` with the user-info of every URL in it (plain, or escaped by Hydra) replaced by ``***``."""
    return _userinfo(text, _REDACTED, None)


def url_without_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user-info, username, password)``, the last two percent-decoded (None: absent)."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    username, has_password, password = userinfo.partition(":")
    bare = urlunsplit(parts._replace(netloc=host))
    return bare, unquote(username), unquote(password) if has_password else None


def walk(
    value: Any, replace: _Replace = _REDACTED, key: Any = None, known: Mapping[str, str] | None = None
) -> Any:
    """``value`` (a config, a summary, overrides, Hydra's record) with ``replace(secret, key)`` for the
    value of each credential key (in a mapping or an override) and each URL's user-info, unless it is
    exactly ``${oc.env:NAME}``. ``known``: strings written as something else first (their interpolation)."""
    if isinstance(value, (DictConfig, ListConfig)):
        try:
            value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # noqa: BLE001 - a node cut off from what it interpolates: its text
            value = OmegaConf.to_container(value, resolve=False)
    if isinstance(value, str) and known:
        value = known.get(value, value)
    if key is not None and is_credential_key(key) and value is not None:
        return value if _is_env_reference(value) else replace(value, key)
    if isinstance(value, Mapping):
        items = {k: walk(v, replace, k, known) for k, v in value.items()}
        try:
            return type(value)(items)  # Lightning's AttributeDict stays one
        except TypeError:
            return items
    if isinstance(value, (list, tuple)):
        return type(value)(walk(v, replace, None, known) for v in value)
    if not isinstance(value, str):
        return value
    if not _OVERRIDE.match(value):
        return _userinfo(value, replace, key)
    parts, key = [], None
    for part in _UNESCAPED_COMMA.split(value):  # a swept value's choices follow its key's part
        match = _OVERRIDE.match(part)
        if match:
            key = match["key"].split("@", 1)[0]
        written = part[match.end() :] if match else part
        if key and is_credential_key(key.rsplit(".", 1)[-1]) and written and not _is_env_reference(written):
            part = part[: match.end() if match else 0] + str(replace(written, key))
        else:
            part = _userinfo(part, replace, key)
        parts.append(part)
    return ",".join(parts)


def _userinfo(text: str, replace: _Replace, key: Any) -> str:
    def written(m: re.Match) -> str:  # user-info read from the environment names it: kept
        user_alone = ":" not in m["userinfo"] and _DATABASE_SCHEME.fullmatch(m["scheme"])
        kept = user_alone or _is_env_reference(_plain(m["userinfo"]))
        userinfo = m["userinfo"] if kept else replace(m["userinfo"], key)
        return f"{m['scheme']}{userinfo}@"

    return _URL_USERINFO.sub(written, text)


def _is_env_reference(value: Any) -> bool:
    return isinstance(value, str) and bool(_PURE_ENV_REFERENCE.match(value.strip("'\"")))


def redact(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as a plain dict, redacted for writing and logging (module docstring)."""
    return Redaction.of(cfg).config


@dataclass
class Redaction:
    """A config's redacted form, and what it needs to redact the values a module was built from."""

    config: dict[str, Any]
    environment_values: dict[str, str]  # resolved values from the environment -> their interpolation

    @classmethod
    def of(cls, cfg: DictConfig) -> Redaction:
        resolved = OmegaConf.to_container(cfg, resolve=True)  # what the run uses
        text = OmegaConf.to_container(cfg, resolve=False)  # the config as written, interpolations and all
        environment_values: dict[str, str] = {}
        for path in _environment_paths(text):  # written as their text, which names the variable
            parent, written = _at(resolved, path[:-1]), _at(text, path)
            if isinstance(parent[path[-1]], str) and parent[path[-1]]:
                environment_values[parent[path[-1]]] = written
            parent[path[-1]] = written
        return cls(walk(resolved), environment_values)

    def values(self, value: Any) -> Any:
        """A module's hyperparameters (built from resolved values), redacted as the config is."""
        return walk(value, known=self.environment_values)


def _environment_paths(text: Any) -> set[tuple]:
    """Paths of the config's values that depend on the environment: their interpolation reads
    ``oc.env``, or resolves to something that did. Found by resolving a copy in which every ``oc.env``
    interpolation is a mark; a value that fails to resolve in that copy counts as one (kept as text)."""
    interpolated = [path for path, value in _leaves(text) if isinstance(value, str) and "${" in value]
    if not interpolated:
        return set()
    marked = OmegaConf.create(text)
    for path, value in _leaves(text):
        if isinstance(value, str) and _READS_ENVIRONMENT.search(value):
            _at(marked, path[:-1])[path[-1]] = _ENV_MARK
    found = set()
    for path in interpolated:
        try:
            value = _at(marked, path)
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # noqa: BLE001 - any resolution error: keep the text, never the value
            found.add(path)
            continue
        if any(isinstance(v, str) and _ENV_MARK in v for _, v in _leaves(value)):
            found.add(path)
    return found


def _leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [(path, value)]


def _at(container: Any, path: tuple) -> Any:
    for key in path:
        container = container[key]
    return container


def typed_overrides(overrides: Any) -> list[str]:
    """Hydra's record of the command line's overrides (``HydraConfig.get().overrides.task``) as they
    were typed. Iterating it resolves each one like a config value: ``key=${oc.env:TOKEN}`` would
    come out holding the token."""
    if isinstance(overrides, ListConfig):
        return [str(o) for o in OmegaConf.to_container(overrides, resolve=False)]
    return [str(o) for o in overrides]


def redact_overrides(overrides: list[str]) -> list[str]:
    """Command-line overrides (``key=value``) as they may be written or logged."""
    return walk(list(overrides))


def redact_command(command: str | list[str]) -> str | list[str]:
    """A sweep job's child command (a list, or a string as a shell reads it), its overrides redacted."""
    if isinstance(command, str):
        try:
            return shlex.join(redact_overrides(shlex.split(command)))
        except ValueError:  # not shell syntax: at least no URL user-info
            return redact_text(command)
    return redact_overrides(list(command))


def redact_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json's fields as written: the overrides, a sweep job's command and every text redacted."""
    sweep = summary.get("sweep")
    if isinstance(sweep, dict) and sweep.get("command"):
        summary = {**summary, "sweep": {**sweep, "command": redact_command(sweep["command"])}}
    return walk({**summary, "overrides": list(summary.get("overrides") or [])})


def unresolvable(config: DictConfig, sections: tuple[str, ...]) -> str | None:
    """Why a config stored redacted (a checkpoint's) cannot be used again where it must: the first
    value of ``sections`` whose interpolation fails to resolve in this process's environment, or that
    was redacted to ``***``; None when every value resolves."""
    for section in sections:
        if section not in config:
            continue
        text = OmegaConf.to_container(config[section], resolve=False)
        for path, written in _leaves(text, (section,)):
            key = ".".join(str(k) for k in path)
            try:
                value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
            except OmegaConfBaseException as error:
                # What the resolver said, without OmegaConf's wrapping of it.
                cause = re.sub(
                    r'^\w+ raised while resolving interpolation: "?(.*?)"?$', r"\1", first_line(error)
                )
                return (
                    f"{key} is stored as {written} (a value from the environment is not written into "
                    f"checkpoints) and cannot be resolved here ({cause}): set it in this environment"
                )
            if isinstance(value, str) and (value == REDACTED or f"://{REDACTED}@" in value):
                return (
                    f"{key} was redacted to {value} when the checkpoint was written (it names a "
                    "credential), and a redacted value cannot be resolved again: give it through the "
                    "environment in the training config (${oc.env:NAME}) so that it can be"
                )
    return None


def redact_hydra_record(output_dir: Any) -> list[str]:
    """Hydra's own record of a run (``<run dir>/.hydra/``) redacted, each file rewritten only where
    something changes; returns the names of those rewritten."""
    rewritten = []
    for path in sorted(Path(output_dir, ".hydra").glob("*.yaml")):
        text = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        redacted = walk(text)
        if redacted != text:
            OmegaConf.save(OmegaConf.create(redacted), path)
            rewritten.append(path.name)
    return rewritten


class CommandLineSecrets(Callback):
    """Hydra callback (src/litlab/conf/hydra/default.yaml): before Hydra writes anything, a credential
    typed on the command line moves into the environment as ``LITLAB_SECRET_<KEY>``, which the
    overrides and the config then read (``${oc.env:...}``). A sweep's jobs inherit the variable, so
    no file and no child's command line holds it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        move_typed_secrets(config)

    on_multirun_start = on_run_start


def move_typed_secrets(cfg: DictConfig) -> dict[str, str]:
    """``CommandLineSecrets`` on a composed config (``cfg``, Hydra's node included); returns the
    variables set (secret -> name)."""
    moved: dict[str, str] = {}

    def to_environment(secret: Any, key: Any) -> Any:
        plain = _plain(secret)
        if "${" in plain:  # an interpolation already: nothing to move
            return secret
        if plain not in moved:
            base = "LITLAB_SECRET_" + re.sub(r"\W+", "_", str(key)).strip("_").upper()
            names = itertools.chain([base], (f"{base}_{n}" for n in itertools.count(2)))
            moved[plain] = next(name for name in names if os.environ.get(name, plain) == plain)
            os.environ[moved[plain]] = plain  # for this process and every process it starts
        return f"${{oc.env:{moved[plain]}}}"

    for group in ("task", "hydra"):  # names each typed secret
        walk(typed_overrides(cfg.hydra.overrides[group]), to_environment)
    if not moved:
        return moved
    # The overrides, Hydra's override_dirname and the composed values read the variables instead.
    written = OmegaConf.to_container(cfg, resolve=False)
    _assign(cfg, written, walk(written, lambda s, k: to_environment(s, k) if _plain(s) in moved else s))
    HydraConfig.instance().set_config(cfg)
    if global_rank() == 0:
        log.warning(
            "a credential typed on the command line reaches the run as %s, never a file; your shell's "
            "history still holds it: pass it through the environment (${oc.env:NAME}) instead",
            ", ".join(moved.values()),
        )
    return moved


def _plain(secret: Any) -> str:
    """A secret as Hydra reads it: unquoted, unescaped."""
    text = str(secret)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return _HYDRA_ESCAPE.sub(r"\1", text)


def _assign(node: Any, old: Any, new: Any) -> None:
    """Sets in ``node`` what differs between ``old`` and ``new``: a whole node where ``walk`` changed
    its shape (a credential key's list becomes one string)."""
    for key in old.keys() if isinstance(old, dict) else range(len(old)):
        if old[key] == new[key]:
            continue
        if isinstance(old[key], (dict, list)) and type(new[key]) is type(old[key]):
            _assign(node[key], old[key], new[key])
        else:
            with flag_override(node, ["readonly", "struct"], [False, False]):  # Hydra's node is read-only
                node[key] = new[key]
