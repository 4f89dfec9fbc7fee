"""The engine's config groups (trainer, strategy, precision, callbacks, storage, logger, oom, hydra,
paths, sweep, debug, hparams_search), on Hydra's search path after the fork's ``configs/``
(``hydra_plugins/litlab_searchpath.py``): a file of the same group and name in ``configs/``
overrides one of these, a new one adds an option (docs/configs.md)."""

# How Hydra's search path names these groups (hydra_plugins/litlab_searchpath.py).
SEARCH_PATH_ENTRY = "pkg://litlab.conf"
