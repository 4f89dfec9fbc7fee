"""The callbacks every litlab run has, whatever its task: run statistics (throughput, history, input wait),
the non-finite guard, the world check, per-step reseeding, the train loader's resume check, the run
config as the loggers' parameters, the model summary; the progress output; an Optuna trial's pruning;
and ``CombinedCallbacks`` (combined), which runs litlab's and Lightning's as one."""
