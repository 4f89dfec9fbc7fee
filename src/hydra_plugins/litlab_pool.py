"""litlab's default launcher, where Hydra looks for plugins; its code is ``litlab.launch.pool``.

Hydra instantiates a launcher only from a class defined in the ``hydra_plugins`` namespace package
(no ``__init__.py``: it is shared with the plugins installed in site-packages).
"""

from __future__ import annotations

from litlab.launch import pool


class DevicePoolLauncher(pool.DevicePoolLauncher):
    """The sweep's jobs as processes of their own on a pool of devices (``litlab.launch.pool``)."""
