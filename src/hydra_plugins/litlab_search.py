"""Registers litlab's Optuna search as a Hydra sweeper (``hydra/sweeper=optuna``,
configs/hydra/sweeper/optuna.yaml).

Hydra instantiates a sweeper only when its ``_target_`` lies under the ``hydra_plugins`` package and
was found by its plugin scan (hydra/core/plugins.py), so the class is declared here, in a module of
that namespace package; its code is ``litlab.launch.search``, which imports Optuna only when a search
starts (Hydra imports this module in every litlab process).
"""

from __future__ import annotations

from litlab.launch import search


class OptunaSearch(search.OptunaSearch):
    """litlab's Optuna search (``litlab.launch.search.OptunaSearch``), under the name Hydra accepts."""
