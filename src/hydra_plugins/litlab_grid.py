"""litlab's grid sweeper, where Hydra looks for plugins; its code is ``litlab.launch.grid``.

Hydra instantiates a sweeper only when its ``_target_`` lies under the ``hydra_plugins`` package.
"""

from __future__ import annotations

from litlab.launch import grid


class GridSweeper(grid.GridSweeper):
    """Every combination of the swept values, planned whole before any job (``litlab.launch.grid``)."""
