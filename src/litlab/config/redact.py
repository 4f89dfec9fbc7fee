"""Credentials stay in the environment: ``redact(cfg)`` is the copy of a config that litlab writes or logs.

A run uses the real values; the stored config.yaml, the config in every checkpoint, the loggers'
parameters and the hyperparameters are redacted: a value read through ``oc.env`` appears as its
interpolation (``litlab-eval`` resolves it again), and a URL's user-info and any key that names a
credential (``is_credential_key``) as ``***``. ``redact_overrides`` does the same to command-line
overrides. The rules: docs/loggers.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

REDACTED = "***"

# A URL's user-info: what lies between "scheme://" and "@" before the host.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/@?#]+)@")
_READS_ENVIRONMENT = re.compile(r"\$\{\s*oc\.env\s*:")
_PURE_ENV_REFERENCE = re.compile(r"^\$\{oc\.env:\s*[A-Za-z_][A-Za-z0-9_]*\s*\}$")
# On the key in snake_case: substrings for the unambiguous names, a word ending in "token" for tokens.
_CREDENTIAL_KEY = re.compile(
    r"password|passwd|secret|credential|api_?key|access_?key|(?:^|_)[a-z0-9]*token(?:_|$)"
)
# Stands for an environment value while finding which values depend on one (no config text has it).
_ENV_MARK = "\x00litlab-environment\x00"


def is_credential_key(key: Any) -> bool:
    """Whether a config key names a credential (see the module docstring for the names)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key)).lower().replace("-", "_")
    return bool(_CREDENTIAL_KEY.search(snake))


def redact_text(text: str) -> str:
    """``text`` with the user-info of every URL in it replaced by ``***``."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


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
        from_environment = _environment_paths(text)
        environment_values: dict[str, str] = {}
        config = _redact_config(resolved, text, from_environment, (), environment_values)
        return cls(config, environment_values)

    def values(self, value: Any) -> Any:
        """A module's or datamodule's hyperparameters (built from resolved values), redacted: a string
        that is a value from the environment becomes its interpolation text; URL user-info and the
        values of credential keys become ``***``."""
        if isinstance(value, (DictConfig, ListConfig)):
            try:
                value = OmegaConf.to_container(value, resolve=True)
            except Exception:  # noqa: BLE001 - a node cut off from what it interpolates: its text
                value = OmegaConf.to_container(value, resolve=False)
        if isinstance(value, Mapping):
            items = {
                k: self._credential(v) if is_credential_key(k) else self.values(v) for k, v in value.items()
            }
            try:
                return type(value)(items)  # Lightning's AttributeDict stays one
            except TypeError:
                return items
        if isinstance(value, (list, tuple)):
            return type(value)(self.values(v) for v in value)
        if isinstance(value, str):
            return redact_text(self.environment_values.get(value, value))
        return value

    def _credential(self, value: Any) -> Any:
        """A credential key's value: ``${oc.env:NAME}`` where the config had exactly that, else ``***``."""
        if value is None:
            return None
        if isinstance(value, str) and _PURE_ENV_REFERENCE.match(value):
            return value  # already redacted: it names the variable, not its value
        text = self.environment_values.get(value) if isinstance(value, str) else None
        return text if text is not None and _PURE_ENV_REFERENCE.match(text) else REDACTED


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
    return [_redact_override(override) for override in overrides]


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
    summary = {**summary, "overrides": redact_overrides(list(summary.get("overrides") or []))}
    sweep = summary.get("sweep")
    if isinstance(sweep, dict) and sweep.get("command"):
        summary["sweep"] = {**sweep, "command": redact_command(sweep["command"])}
    return _redact_strings(summary)


def _redact_strings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _redact_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_strings(v) for v in value]
    return redact_text(value) if isinstance(value, str) else value


def _redact_override(override: str) -> str:
    key, equals, value = override.partition("=")
    name = key.lstrip("+~").split("@", 1)[0].rsplit(".", 1)[-1]
    if equals and is_credential_key(name) and value and not _PURE_ENV_REFERENCE.match(value.strip("'\"")):
        return f"{key}={REDACTED}"
    return redact_text(override)


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
            node: Any = marked
            for key in path[:-1]:
                node = node[key]
            value = node[path[-1]]
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


def _redact_config(
    resolved: Any, text: Any, from_environment: set[tuple], path: tuple, environment_values: dict[str, str]
) -> Any:
    if path and is_credential_key(path[-1]) and resolved is not None:
        if isinstance(text, str) and _PURE_ENV_REFERENCE.match(text):
            _remember(resolved, text, environment_values)
            return text
        return REDACTED
    if path in from_environment:
        _remember(resolved, text, environment_values)
        return redact_text(text)
    if isinstance(resolved, dict):
        return {
            k: _redact_config(v, _child(text, k), from_environment, (*path, k), environment_values)
            for k, v in resolved.items()
        }
    if isinstance(resolved, list):
        return [
            _redact_config(v, _child(text, i), from_environment, (*path, i), environment_values)
            for i, v in enumerate(resolved)
        ]
    if isinstance(resolved, str):
        return redact_text(resolved)
    return resolved


def _child(text: Any, key: Any) -> Any:
    """The config text under ``key``; None where the text is an interpolation of the whole container."""
    if isinstance(text, dict):
        return text.get(key)
    if isinstance(text, list) and isinstance(key, int) and key < len(text):
        return text[key]
    return None


def _remember(resolved: Any, text: str, environment_values: dict[str, str]) -> None:
    # A container's own values from the environment are remembered at their own paths.
    if isinstance(resolved, str) and resolved:
        environment_values[resolved] = text


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
    overrides as typed), with a credential typed on the command line redacted: URL user-info and
    credential keys' values, in every file, as ``redact_overrides`` does. Values from the environment
    are not there (Hydra writes interpolations unresolved). A file is rewritten only where something
    changes; returns the names of those rewritten."""
    from pathlib import Path

    rewritten = []
    for path in sorted(Path(output_dir, ".hydra").glob("*.yaml")):
        text = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        redacted = _redact_written_text(text)
        if redacted != text:
            OmegaConf.save(OmegaConf.create(redacted), path)
            rewritten.append(path.name)
    return rewritten


def _redact_written_text(text: Any, key: Any = None) -> Any:
    if key is not None and is_credential_key(key) and text is not None:
        return text if isinstance(text, str) and _PURE_ENV_REFERENCE.match(text) else REDACTED
    if isinstance(text, dict):
        return {k: _redact_written_text(v, k) for k, v in text.items()}
    if isinstance(text, list):
        return [_redact_written_text(v) for v in text]
    if isinstance(text, str) and "=" in text:  # an override, or Hydra's comma-joined override_dirname
        return ",".join(_redact_override(part) for part in text.split(","))
    return redact_text(text) if isinstance(text, str) else text
