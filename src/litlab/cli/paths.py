"""Paths pasted on the command line: one line on how to quote a path that Hydra cannot read as is.

The paths litlab prints paste into ``ckpt_path=`` and ``resume=`` as they are; a path of your own with
``=``, brackets, quotes, ``~`` or a comma must be quoted for Hydra and the shell (``check_pasted_paths``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from litlab.errors import EXIT_REFUSED, error_line

PATH_KEYS = ("ckpt_path", "resume")


def quoted(key: str, path: str) -> str:
    """``key="path"`` as Hydra reads a quoted value, quoted again for a POSIX shell."""
    escaped = path.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(f'{key}="{escaped}"')


def unreadable_path(arg: str, multirun: bool) -> str | None:
    """The one-line error for a ``ckpt_path=``/``resume=`` override Hydra would misread, else None."""
    key, sep, path = arg.partition("=")
    if not sep or key.lstrip("+") not in PATH_KEYS:
        return None
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException:
        problem = "holds characters Hydra reads as override syntax"
    else:
        if multirun or not override.is_sweep_override():
            return None
        problem = "holds a comma, which Hydra reads as a sweep over several values"
    example = quoted(key.lstrip("+"), path)
    return f"{key}={path} {problem}: quote the path for Hydra and the shell, e.g. {example}"


def check_pasted_paths(args: Sequence[str]) -> None:
    """Exit 2 with that line when an argument is such a path (before Hydra's own, longer error)."""
    multirun = any(arg in ("-m", "--multirun") for arg in args)
    for arg in args:
        message = unreadable_path(arg, multirun)
        if message is not None:
            print(error_line(message), file=sys.stderr)
            sys.exit(EXIT_REFUSED)
