"""The console scripts: ``litlab-train``, ``litlab-eval``, ``litlab-predict``, ``litlab-compare``, each
a short recipe, and the command line's preflight."""
