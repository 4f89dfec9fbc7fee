"""The callbacks every litlab run has, whatever its task (per-step reseeding and whole global batches
are ``litlab.data``'s), the progress output, an Optuna trial's pruning, and ``CombinedCallbacks``,
which runs litlab's and Lightning's as one."""
