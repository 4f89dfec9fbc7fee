"""Puts the engine's config groups (``litlab.conf``) on Hydra's search path, after the fork's
``configs/``, so a file there overrides or adds an option of an engine group.

Hydra finds search-path plugins only in the ``hydra_plugins`` namespace package; this is how
Hydra's own plugins ship their configs.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from litlab.conf import SEARCH_PATH_ENTRY


class LitlabSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="litlab", path=SEARCH_PATH_ENTRY)
