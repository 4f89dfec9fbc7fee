"""The config groups that ``--help`` lists, through the ``litlab_config_groups`` resolver of Hydra's help
template (src/litlab/conf/hydra/help/).

The groups a user picks, with their options and the chosen one marked ``*``, read from the config
search path only when help is asked for: a group or option added to configs/ shows up by itself.
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

RESOLVER = "litlab_config_groups"
# Groups in the order a user thinks of them: what runs, how it trains, where it goes, what it sweeps.
ORDER = [
    "data",
    "model",
    "optimizer",
    "scheduler",
    "experiment",
    "trainer",
    "precision",
    "strategy",
    "callbacks",
    "logger",
    "storage",
    "oom",
    "debug",
    "sweep",
    "hparams_search",
    "hydra/launcher",
]
_NOT_PICKED = ("schema", "paths", "local", "hydra")


def _picked(group: str) -> bool:
    return group == "hydra/launcher" or group.split("/")[0] not in _NOT_PICKED


def config_groups() -> str:
    """The groups a user picks with ``GROUP=OPTION``, one line each, for the help template; empty
    unless the command line asks for ``--help``.

    omegaconf resolves the template whenever Hydra merges a config into it, so in every compose, not
    only for ``--help``; listing the groups was most of a compose's time (docs/performance.md), and a
    run started through Hydra's main composes three times (the preflight, its run mode, the job)."""
    if not _help_asked():
        return ""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    hydra = GlobalHydra.instance().hydra
    if hydra is None:
        return ""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    groups = [group for group in hydra.list_all_config_groups() if _picked(group)]
    groups.sort(key=lambda group: (ORDER.index(group) if group in ORDER else len(ORDER), group))
    width = max((len(group) for group in groups), default=0)
    lines = []
    for group in groups:
        chosen = choices.get(group)
        options = [
            f"{o}*" if o == chosen else o for o in sorted(hydra.config_loader.get_group_options(group))
        ]
        lines.append(f"  {group:<{width}}  {', '.join(options)}")
    return "\n".join(lines)


def _help_asked() -> bool:
    """Whether this command line asks Hydra for the app's help (Hydra reads the same ``sys.argv``)."""
    return any(arg in ("--help", "-h") for arg in sys.argv[1:])


def register() -> None:
    """Make ``${litlab_config_groups:}`` available to the help templates (idempotent; called by
    ``litlab.config.resolvers.register``, so wherever configs are composed)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, config_groups, use_cache=False)
