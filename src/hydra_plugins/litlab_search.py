"""Registers litlab's Optuna search as a Hydra sweeper (``hydra/sweeper=optuna``); its code is
``litlab.launch.search``.

Hydra instantiates a sweeper only when its ``_target_`` lies under the ``hydra_plugins`` package, and
imports this module in every litlab process, so Optuna is imported only when a search starts.
"""

from __future__ import annotations

from litlab.launch import search


class OptunaSearch(search.OptunaSearch):
    """litlab's Optuna search (``litlab.launch.search.OptunaSearch``), under the name Hydra accepts."""
