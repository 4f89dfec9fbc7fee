"""litlab's default launcher, where Hydra looks for plugins.

Hydra instantiates a launcher only from a class defined in the ``hydra_plugins`` namespace package
(and registers it under the module that defines it), so the class lives here by name; the code is
in ``litlab.launch.pool``. Config: configs/hydra/launcher/local.yaml. No ``__init__.py`` in
src/hydra_plugins/: it is a namespace package, shared with the plugins installed in site-packages.
"""

from __future__ import annotations

from litlab.launch import pool


class DevicePoolLauncher(pool.DevicePoolLauncher):
    """The sweep's jobs as processes of their own on a pool of devices (``litlab.launch.pool``)."""
