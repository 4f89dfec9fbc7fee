"""The config groups that ``--help`` lists, through the ``litlab_config_groups`` resolver of Hydra's help
template (src/litlab/conf/hydra/help/): the groups a user picks, with their options and the chosen one
marked ``*``, read from the config search path, so that a group or option added to configs/ shows up.
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

_RESOLVER = "litlab_config_groups"
# Groups in the order a user thinks of them: what runs, how it trains, where it goes, what it sweeps.
_ORDER = ["data", "model", "optimizer", "scheduler", "experiment", "trainer", "precision", "strategy"]
_ORDER += ["callbacks", "logger", "storage", "oom", "debug", "sweep", "hparams_search", "hydra/launcher"]
_NOT_PICKED = ("schema", "paths", "local", "hydra")


def _config_groups() -> str:
    """The groups a user picks with ``GROUP=OPTION``, one line each; empty unless the command line asks
    for ``--help``: omegaconf resolves the template in every compose, and listing the groups was most
    of a compose's time (docs/performance.md)."""
    if not any(arg in ("--help", "-h") for arg in sys.argv[1:]):  # Hydra reads the same sys.argv
        return ""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    hydra = GlobalHydra.instance().hydra
    if hydra is None:
        return ""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    every = hydra.list_all_config_groups()
    groups = [g for g in every if g == "hydra/launcher" or g.split("/")[0] not in _NOT_PICKED]
    groups.sort(key=lambda group: (_ORDER.index(group) if group in _ORDER else len(_ORDER), group))
    width = max((len(group) for group in groups), default=0)
    lines = []
    for group in groups:
        options = sorted(hydra.config_loader.get_group_options(group))
        marked = [f"{o}*" if o == choices.get(group) else o for o in options]
        lines.append(f"  {group:<{width}}  {', '.join(marked)}")
    return "\n".join(lines)


def register() -> None:
    """Make ``${litlab_config_groups:}`` available to the help templates (idempotent)."""
    if not OmegaConf.has_resolver(_RESOLVER):
        OmegaConf.register_new_resolver(_RESOLVER, _config_groups, use_cache=False)
