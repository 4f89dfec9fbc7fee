"""Credentials stay in the environment: ``redact(cfg)`` is the copy of a config that litlab writes or logs.

A run uses the real values; the stored config.yaml, the config in every checkpoint, the loggers'
parameters and the hyperparameters are redacted: a value read through ``oc.env`` appears as its
interpolation (``litlab-eval`` resolves it again), and a URL's user-info and any key that names a
credential (``is_credential_key``) as ``***``. ``walk`` is the one walker that does it, for configs,
overrides (plain, or as Hydra escapes them: ``http\\://user\\:pw@host``), summaries and Hydra's
records. ``CommandLineSecrets`` moves a credential typed on the command line into the environment
before Hydra writes anything. The rules: docs/loggers.md.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf, flag_override

from litlab.logs import global_rank

log = logging.getLogger(__name__)

REDACTED = "***"

# A URL's user-info: what lies between "scheme://" (or Hydra's escaped "scheme\://") and "@" before the host.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*\\?://)(?P<userinfo>[^\s/@?#]+)@")
# An override (``+key@package=value``), or the first of Hydra's comma-joined ones (override_dirname).
# A database URL (SQLAlchemy's dialect[+driver]) names its user there, the password set elsewhere
# (PGPASSWORD, ~/.pgpass): a user name alone is no credential; elsewhere it can be a token.
_DATABASE_SCHEME = re.compile(r"(?:postgres(?:ql)?|mysql|mariadb|mssql|oracle|cockroachdb)(?:\+\w+)?\\?://")
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
Replace = Callable[[Any, Any], Any]
_REDACTED: Replace = lambda secret, key: REDACTED  # noqa: E731


def is_credential_key(key: Any) -> bool:
    """Whether a config key names a credential (see the module docstring for the names)."""
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
    value: Any, replace: Replace = _REDACTED, key: Any = None, known: Mapping[str, str] | None = None
) -> Any:
    """``value`` (a config, a summary, a list of overrides, Hydra's record) with each credential in it
    replaced by ``replace(secret, key)`` (``***``): the value of a credential key, in a mapping or in an
    override (``key=value``, or Hydra's comma-joined ``override_dirname``), and the user-info of every
    URL, plain or as Hydra escapes it; either is kept where it is exactly ``${oc.env:NAME}``.
    ``known``: strings written as something else first (a value from the environment: its interpolation)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = _container(value)
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


def _userinfo(text: str, replace: Replace, key: Any) -> str:
    def written(m: re.Match) -> str:  # user-info read from the environment names it: kept
        user_alone = ":" not in m["userinfo"] and _DATABASE_SCHEME.fullmatch(m["scheme"])
        kept = user_alone or _is_env_reference(_plain(m["userinfo"]))
        userinfo = m["userinfo"] if kept else replace(m["userinfo"], key)
        return f"{m['scheme']}{userinfo}@"

    return _URL_USERINFO.sub(written, text)


def _is_env_reference(value: Any) -> bool:
    return isinstance(value, str) and bool(_PURE_ENV_REFERENCE.match(value.strip("'\"")))


def _container(value: DictConfig | ListConfig) -> Any:
    try:
        return OmegaConf.to_container(value, resolve=True)
    except Exception:  # noqa: BLE001 - a node cut off from what it interpolates: its text
        return OmegaConf.to_container(value, resolve=False)


def redact(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as a plain dict, redacted for writing and logging (module docstring)."""
    return Redaction.of(cfg).config


class Redaction:
    """A config's redacted form, and what it needs to redact the values a module was built from."""

    def __init__(self, config: dict[str, Any], environment_values: dict[str, str]) -> None:
        self.config = config
        # Resolved string values that came from the environment -> the interpolation text written instead.
        self.environment_values = environment_values

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
        """A module's or datamodule's hyperparameters (built from resolved values), redacted: a string
        that is a value from the environment becomes its interpolation text; URL user-info and the
        values of credential keys become ``***``."""
        return walk(value, known=self.environment_values)


def _environment_paths(text: Any) -> set[tuple]:
    """Paths of the config's values that depend on the environment: their interpolation reads
    ``oc.env``, or resolves to something that did. Found by resolving a copy in which every ``oc.env``
    interpolation is a mark; a value that fails to resolve in that copy counts as one (kept as text)."""
    interpolated = [path for path, value in _leaves(text) if isinstance(value, str) and "${" in value]
    if not interpolated:
        return set()
    marked = OmegaConf.create(_mark_environment(text))
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


def _mark_environment(text: Any) -> Any:
    if isinstance(text, dict):
        return {k: _mark_environment(v) for k, v in text.items()}
    if isinstance(text, list):
        return [_mark_environment(v) for v in text]
    if isinstance(text, str) and _READS_ENVIRONMENT.search(text):
        return _ENV_MARK
    return text


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
    """Command-line overrides (``key=value``) as they may be written or logged: the value of a
    credential key is ``***`` (unless it is exactly ``${oc.env:NAME}``), URL user-info is ``***``."""
    return walk(list(overrides))


def redact_command(command: str | list[str]) -> str | list[str]:
    """A command line (a sweep job's child command: a list, or a string as a shell reads it) with its
    ``key=value`` arguments redacted as ``redact_overrides`` does."""
    if isinstance(command, str):
        import shlex

        try:
            return shlex.join(redact_overrides(shlex.split(command)))
        except ValueError:  # not shell syntax: at least no URL user-info
            return redact_text(command)
    return redact_overrides(list(command))


def redact_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json's fields as written: the overrides and a sweep job's command redacted, and no URL
    user-info in any text (an error message, the storage folder's URL)."""
    sweep = summary.get("sweep")
    if isinstance(sweep, dict) and sweep.get("command"):
        summary = {**summary, "sweep": {**sweep, "command": redact_command(sweep["command"])}}
    return walk({**summary, "overrides": list(summary.get("overrides") or [])})


def unresolvable(config: DictConfig, sections: tuple[str, ...]) -> str | None:
    """Why a config stored redacted (a checkpoint's) cannot be used again where it must: the first
    value of ``sections`` whose interpolation fails to resolve in this process's environment, or that
    was redacted to ``***``; None when every value resolves."""
    from omegaconf.errors import OmegaConfBaseException

    for section in sections:
        if section not in config:
            continue
        text = OmegaConf.to_container(config[section], resolve=False)
        for path, written in _leaves(text, (section,)):
            key = ".".join(str(k) for k in path)
            try:
                value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
            except OmegaConfBaseException as error:
                cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
                # What the resolver said, without OmegaConf's wrapping of it.
                cause = re.sub(r'^\w+ raised while resolving interpolation: "?(.*?)"?$', r"\1", cause)
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
    """Hydra's own record of a run (``<run dir>/.hydra/``: the composed config, unresolved, and the
    overrides as typed), with credentials redacted by ``walk``, in every file. Values from the
    environment are not there (Hydra writes interpolations unresolved), nor is a credential typed on
    the command line (``CommandLineSecrets``). A file is rewritten only where something
    changes; returns the names of those rewritten."""
    from pathlib import Path

    rewritten = []
    for path in sorted(Path(output_dir, ".hydra").glob("*.yaml")):
        text = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        redacted = walk(text)
        if redacted != text:
            OmegaConf.save(OmegaConf.create(redacted), path)
            rewritten.append(path.name)
    return rewritten


class CommandLineSecrets(Callback):
    """Hydra callback (src/litlab/conf/hydra/default.yaml): when Hydra's run or multirun starts, before
    it writes anything, a credential typed on the command line (a URL's user-info, a credential key's
    value) moves into this process's environment as ``LITLAB_SECRET_<KEY>``, which the overrides and
    the composed config then read (``${oc.env:LITLAB_SECRET_<KEY>}``). The run resolves the real
    value; a sweep's jobs and their child processes inherit the variable, so no file (multirun.yaml,
    .hydra/, command.sh, summary.json, a trial's record) and no child's command line holds it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        move_typed_secrets(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        move_typed_secrets(config)


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
    _assign(
        cfg,
        written,
        walk(written, lambda secret, key: to_environment(secret, key) if _plain(secret) in moved else secret),
    )
    HydraConfig.instance().set_config(cfg)
    if global_rank() == 0:
        names = ", ".join(moved.values())
        log.warning(
            "a credential typed on the command line reaches the run as %s, never a file; your shell's "
            "history still holds it: pass it through the environment (${oc.env:NAME}) instead",
            names,
        )
    return moved


def _plain(secret: Any) -> str:
    """A secret as Hydra reads it: unquoted, unescaped."""
    text = str(secret)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return _HYDRA_ESCAPE.sub(r"\1", text)


def _assign(node: Any, old: Any, new: Any) -> None:
    for key in old.keys() if isinstance(old, dict) else range(len(old)):
        if old[key] == new[key]:
            continue
        if isinstance(old[key], (dict, list)) and type(new[key]) is type(old[key]):
            _assign(node[key], old[key], new[key])
        else:
            with flag_override(node, ["readonly", "struct"], [False, False]):  # Hydra's node is read-only
                node[key] = new[key]
