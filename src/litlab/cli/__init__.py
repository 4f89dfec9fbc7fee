"""The console scripts: ``litlab-train``, ``litlab-eval``, ``litlab-compare``, each a short recipe."""
