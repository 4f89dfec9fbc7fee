"""``-m``/``--multirun`` anywhere on the command line: people type the flag where they think of it.

Hydra's parser reads its flags before the overrides only (``litlab-train experiment=char_lm -m
precision=fp32,bf16`` fails with ``unrecognized arguments``); the flag is moved to the front first.
"""

from __future__ import annotations

MULTIRUN_FLAGS = ("-m", "--multirun")


def multirun_flag_first(args: list[str]) -> list[str]:
    """``args`` with ``-m``/``--multirun`` first (once); unchanged without it."""
    flags = [arg for arg in args if arg in MULTIRUN_FLAGS]
    if not flags:
        return args
    return [flags[0], *(arg for arg in args if arg not in MULTIRUN_FLAGS)]
