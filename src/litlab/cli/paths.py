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

from litlab.cli.flags import MULTIRUN_FLAGS
from litlab.errors import EXIT_REFUSED, error_line

_PATH_KEYS = ("ckpt_path", "resume")


def check_pasted_paths(args: Sequence[str]) -> None:
    """Exit 2 with one line when an argument is such a path (before Hydra's own, longer error)."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in args)
    for arg in args:
        message = _unreadable_path(arg, multirun)
        if message is not None:
            print(error_line(message), file=sys.stderr)
            sys.exit(EXIT_REFUSED)


def _unreadable_path(arg: str, multirun: bool) -> str | None:
    """The one-line error for a ``ckpt_path=``/``resume=`` override Hydra would misread, else None."""
    key, sep, path = arg.partition("=")
    if not sep or key.lstrip("+") not in _PATH_KEYS:
        return None
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException:
        problem = "holds characters Hydra reads as override syntax"
    else:
        if multirun or not override.is_sweep_override():
            return None
        problem = "holds a comma, which Hydra reads as a sweep over several values"
    escaped = path.replace("\\", "\\\\").replace('"', '\\"')  # as Hydra reads a quoted value
    example = shlex.quote(f'{key.lstrip("+")}="{escaped}"')  # then quoted for a POSIX shell
    return f"{key}={path} {problem}: quote the path for Hydra and the shell, e.g. {example}"
